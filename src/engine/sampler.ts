/**
 * Sampling as vLLM (v1) does it: logits processors (allowed_token_ids, bad_words, min_tokens, logit_bias),
 * penalties (repetition on prompt + output, presence/frequency on output), then greedy argmax when
 * temperature < 1e-5, else temperature → min_p → top_k → top_p → a draw from the per-sequence PRNG.
 * Logprobs are computed from the raw model logits (vLLM's default `raw_logprobs`).
 */
import { applyBadWords } from "./bad-words.js";
import type { Rng } from "./prng.js";

/** The sampling fields of one request (already validated). */
export interface SamplingParams {
  n: number;
  temperature: number;
  topP: number;
  /** -1 or 0: off. */
  topK: number;
  minP: number;
  repetitionPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  /** vLLM's seed, exact (a Python int in [−2^63, 2^63 − 1]). */
  seed: bigint | null;
  maxTokens: number;
  minTokens: number;
  ignoreEos: boolean;
  stop: string[];
  stopTokenIds: number[];
  includeStopStrInOutput: boolean;
  /** Number of top logprobs per generated token, or null for none. */
  logprobs: number | null;
  promptLogprobs: number | null;
  skipSpecialTokens: boolean;
  logitBias: Map<number, number> | null;
  allowedTokenIds: number[] | null;
  /** Words never generated (their token sequences are the sampler state's). */
  badWords: string[];
}

/** Per-sequence state the sampler needs. */
export interface SamplerState {
  rng: Rng;
  /** Token → count over the prompt (repetition penalty). */
  promptCounts: Map<number, number>;
  /** Token → count over generated tokens. */
  outputCounts: Map<number, number>;
  generated: number;
  eosId: number;
  /** The token ids generated so far (bad_words match their end). */
  outputIds: readonly number[];
  /** The token sequences of the request's bad_words (bad-words.ts), or none. */
  badWordsTokenIds: readonly (readonly number[])[];
}

export const GREEDY_EPS = 1e-5;

let work = new Float32Array(0);
let sortBuf = new Float32Array(0);

/** Samples the next token from raw `logits` (not modified). */
export function sampleToken(logits: Float32Array, p: SamplingParams, st: SamplerState): number {
  const V = logits.length;
  const plain =
    !p.allowedTokenIds &&
    st.badWordsTokenIds.length === 0 &&
    st.generated >= p.minTokens &&
    !p.logitBias &&
    p.repetitionPenalty === 1 &&
    p.presencePenalty === 0 &&
    p.frequencyPenalty === 0;
  if (plain && p.temperature < GREEDY_EPS) return argmax(logits);
  if (work.length !== V) work = new Float32Array(V);
  const w = work;
  w.set(logits);
  if (p.allowedTokenIds) {
    const keep = new Float32Array(p.allowedTokenIds.length);
    p.allowedTokenIds.forEach((id, i) => {
      keep[i] = w[id]!;
    });
    w.fill(Number.NEGATIVE_INFINITY);
    p.allowedTokenIds.forEach((id, i) => {
      w[id] = keep[i]!;
    });
  }
  if (st.badWordsTokenIds.length > 0) applyBadWords(w, st.badWordsTokenIds, st.outputIds);
  if (st.generated < p.minTokens) {
    if (!p.ignoreEos) w[st.eosId] = Number.NEGATIVE_INFINITY;
    for (const id of p.stopTokenIds) if (id < V) w[id] = Number.NEGATIVE_INFINITY;
  }
  if (p.logitBias) for (const [id, b] of p.logitBias) if (id < V) w[id]! += b;
  if (p.repetitionPenalty !== 1) {
    const rp = p.repetitionPenalty;
    const seen = new Set<number>([...st.promptCounts.keys(), ...st.outputCounts.keys()]);
    for (const id of seen) {
      const x = w[id]!;
      w[id] = x > 0 ? x / rp : x * rp;
    }
  }
  if (p.presencePenalty !== 0 || p.frequencyPenalty !== 0) {
    for (const [id, c] of st.outputCounts) w[id]! -= p.frequencyPenalty * c + p.presencePenalty;
  }
  if (p.temperature < GREEDY_EPS) return argmax(w);
  const invT = 1 / p.temperature;
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < V; i++) {
    const x = w[i]! * invT;
    w[i] = x;
    if (x > max) max = x;
  }
  if (max === Number.NEGATIVE_INFINITY) return argmax(logits);
  if (p.minP > 0) {
    // keep tokens whose probability ≥ min_p · max probability
    const cut = max + Math.log(p.minP);
    for (let i = 0; i < V; i++) if (w[i]! < cut) w[i] = Number.NEGATIVE_INFINITY;
  }
  if (p.topK > 0 && p.topK < V) {
    const kth = kthLargest(w, p.topK);
    for (let i = 0; i < V; i++) if (w[i]! < kth) w[i] = Number.NEGATIVE_INFINITY;
  }
  if (p.topP < 1) {
    const threshold = topPThreshold(w, max, p.topP);
    for (let i = 0; i < V; i++) if (w[i]! < threshold) w[i] = Number.NEGATIVE_INFINITY;
  }
  let sum = 0;
  for (let i = 0; i < V; i++) {
    const e = Math.exp(w[i]! - max);
    w[i] = e;
    sum += e;
  }
  const target = st.rng.next() * sum;
  let acc = 0;
  let last = -1;
  for (let i = 0; i < V; i++) {
    const e = w[i]!;
    if (e <= 0) continue;
    acc += e;
    last = i;
    if (acc > target) return i;
  }
  return last >= 0 ? last : argmax(logits);
}

const BUCKETS = 4096;
const bucketMass = new Float64Array(BUCKETS);

/**
 * The smallest logit value v such that the tokens with logit ≥ v hold at least `topP` of the
 * probability mass (ties at v kept). O(V): mass is bucketed by logit, only the boundary bucket is sorted.
 */
function topPThreshold(w: Float32Array, max: number, topP: number): number {
  const V = w.length;
  const lo = max - 60;
  const scale = (BUCKETS - 1) / (max - lo);
  bucketMass.fill(0);
  let total = 0;
  for (let i = 0; i < V; i++) {
    const x = w[i]!;
    if (x === Number.NEGATIVE_INFINITY) continue;
    const e = Math.exp(x - max);
    total += e;
    bucketMass[x <= lo ? 0 : Math.floor((x - lo) * scale)]! += e;
  }
  const target = topP * total;
  let cum = 0;
  let b = BUCKETS - 1;
  for (; b > 0; b--) {
    if (cum + bucketMass[b]! >= target) break;
    cum += bucketMass[b]!;
  }
  const inBucket: number[] = [];
  for (let i = 0; i < V; i++) {
    const x = w[i]!;
    if (x === Number.NEGATIVE_INFINITY) continue;
    const bx = x <= lo ? 0 : Math.floor((x - lo) * scale);
    if (bx === b) inBucket.push(x);
  }
  inBucket.sort((a, c) => c - a);
  let threshold = inBucket[0] ?? max;
  for (const x of inBucket) {
    threshold = x;
    cum += Math.exp(x - max);
    if (cum >= target) break;
  }
  return threshold;
}

/** Index of the largest value (first on ties). */
export function argmax(a: Float32Array): number {
  let best = 0;
  let bv = a[0]!;
  for (let i = 1; i < a.length; i++) {
    const x = a[i]!;
    if (x > bv) {
      bv = x;
      best = i;
    }
  }
  return best;
}

function kthLargest(a: Float32Array, k: number): number {
  if (sortBuf.length !== a.length) sortBuf = new Float32Array(a.length);
  sortBuf.set(a);
  sortBuf.sort();
  return sortBuf[a.length - k]!;
}

/** log Σ exp(logits). */
export function logSumExp(logits: Float32Array): number {
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  let s = 0;
  for (let i = 0; i < logits.length; i++) s += Math.exp(logits[i]! - max);
  return max + Math.log(s);
}

/** The `n` highest-logit ids, best first (ties: lower id first). */
export function topIds(logits: Float32Array, n: number): number[] {
  if (n <= 0) return [];
  const ids: number[] = [];
  const vals: number[] = [];
  for (let i = 0; i < logits.length; i++) {
    const x = logits[i]!;
    if (ids.length === n && x <= vals[n - 1]!) continue;
    let j = ids.length === n ? n - 1 : ids.length;
    if (ids.length < n) {
      ids.push(i);
      vals.push(x);
    }
    while (j > 0 && vals[j - 1]! < x) {
      ids[j] = ids[j - 1]!;
      vals[j] = vals[j - 1]!;
      j--;
    }
    ids[j] = i;
    vals[j] = x;
  }
  return ids;
}

/** 1-based rank of `id` (1 + number of tokens with a strictly larger logit). */
export function rankOf(logits: Float32Array, id: number): number {
  const x = logits[id]!;
  let r = 1;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > x) r++;
  return r;
}

/** Logprob info of one position: the chosen token plus the top `n`. */
export interface TokenLogprobs {
  id: number;
  logprob: number;
  rank: number;
  top: { id: number; logprob: number }[];
}

/** Computes logprobs of `id` and the top `n` from raw logits. `withRank` adds the rank (O(V)). */
export function computeLogprobs(
  logits: Float32Array,
  id: number,
  n: number,
  withRank: boolean,
): TokenLogprobs {
  const lz = logSumExp(logits);
  return {
    id,
    logprob: logits[id]! - lz,
    rank: withRank ? rankOf(logits, id) : 0,
    top: topIds(logits, n).map((t) => ({ id: t, logprob: logits[t]! - lz })),
  };
}
