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

/** Creates a generator from any seed (number, bigint or string); equal seeds give equal streams. */
export function createRng(seed: number | string | bigint): Rng {
  const sm = splitmix32(hashSeed(seed));
  let a = sm();
  let b = sm();
  let c = sm();
  let d = sm();
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
