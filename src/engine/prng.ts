/**
 * Deterministic pseudo-random numbers (xoshiro128**), identical on every machine.
 * Used for model weights (fixed seeds) and for per-request sampling (vLLM's `seed`).
 */

/** A seeded generator. `next()` is uniform in [0, 1); `gaussian()` is N(0, 1). */
export interface Rng {
  next(): number;
  nextU32(): number;
  gaussian(): number;
}

function splitmix32(state: number): () => number {
  let s = state >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
}

/** FNV-1a over the decimal/string form of a seed: any seed value maps to 32 bits. */
export function hashSeed(seed: number | string | bigint): number {
  const text = typeof seed === "string" ? seed : String(seed);
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

const U32 = 0xffffffffn;

/**
 * xoshiro128** state from a 64-bit integer seed (taken mod 2^64, as torch's `manual_seed` takes
 * negative seeds): two splitmix64 outputs. The first output is a bijection of the seed, so
 * distinct seeds (mod 2^64) give distinct states — every bit of the seed matters.
 */
export function stateFromU64(seed: bigint): [number, number, number, number] {
  let s = BigInt.asUintN(64, seed);
  const next = (): bigint => {
    s = BigInt.asUintN(64, s + 0x9e3779b97f4a7c15n);
    let z = s;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    return z ^ (z >> 31n);
  };
  const x = next();
  const y = next();
  return [Number(x & U32), Number(x >> 32n), Number(y & U32), Number(y >> 32n)];
}

/**
 * Creates a generator; equal seeds give equal streams. A bigint (a request's `seed`) seeds the
 * state from its full 64-bit value; a string or number is hashed to 32 bits (model weights).
 */
export function createRng(seed: number | string | bigint): Rng {
  let a: number;
  let b: number;
  let c: number;
  let d: number;
  if (typeof seed === "bigint") [a, b, c, d] = stateFromU64(seed);
  else {
    const sm = splitmix32(hashSeed(seed));
    a = sm();
    b = sm();
    c = sm();
    d = sm();
  }
  if ((a | b | c | d) === 0) a = 1;
  let spare: number | null = null;
  const nextU32 = (): number => {
    const result = Math.imul(rotl(Math.imul(b, 5) >>> 0, 7), 9) >>> 0;
    const t = (b << 9) >>> 0;
    c ^= a;
    d ^= b;
    b ^= c;
    a ^= d;
    c ^= t;
    d = rotl(d, 11);
    return result;
  };
  const next = (): number => nextU32() / 4294967296;
  const gaussian = (): number => {
    if (spare !== null) {
      const s = spare;
      spare = null;
      return s;
    }
    let u = next();
    while (u <= 0) u = next();
    const v = next();
    const r = Math.sqrt(-2 * Math.log(u));
    spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  };
  return { next, nextU32, gaussian };
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}
