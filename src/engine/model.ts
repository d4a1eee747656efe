/**
 * The transformer: Llama architecture in Float32Array maths.
 *
 * Per layer: RMSNorm → multi-head causal self-attention with RoPE (KV cache) → residual add →
 * RMSNorm → SwiGLU MLP → residual add; then final RMSNorm and the unembedding.
 * Projections are `Linear` maps (dense matrices, or sparse ones for the llama-8b preset).
 */

/** y = W·x for a fixed W of shape (outDim, inDim). `apply` overwrites `out` (length outDim). */
export interface Linear {
  readonly inDim: number;
  readonly outDim: number;
  apply(x: Float32Array, out: Float32Array): void;
}

/** Dense linear map; `w` is row-major (outDim × inDim). */
export function createDenseLinear(outDim: number, inDim: number, w: Float32Array): Linear {
  if (w.length !== outDim * inDim)
    throw new Error(`dense weight has ${w.length} values, want ${outDim * inDim}`);
  return {
    inDim,
    outDim,
    apply(x, out) {
      for (let r = 0; r < outDim; r++) {
        let s = 0;
        const base = r * inDim;
        for (let c = 0; c < inDim; c++) s += w[base + c]! * x[c]!;
        out[r] = s;
      }
    },
  };
}

/**
 * Sparse linear map from coordinate lists: W[rows[e], cols[e]] = w[e] (duplicates add up).
 * Cost O(nnz) per application.
 */
export function createSparseLinear(
  outDim: number,
  inDim: number,
  rows: Int32Array,
  cols: Int32Array,
  w: Float32Array,
): Linear {
  const nnz = w.length;
  if (rows.length !== nnz || cols.length !== nnz) throw new Error("sparse weight arrays differ in length");
  return {
    inDim,
    outDim,
    apply(x, out) {
      out.fill(0);
      for (let e = 0; e < nnz; e++) out[rows[e]!]! += w[e]! * x[cols[e]!]!;
    },
  };
}

/** Wide → narrow sparse map: input coordinate j adds w[j]·x[j] to output unit unit[j]. O(inDim). */
export function createScatterLinear(outDim: number, unit: Int32Array, w: Float32Array): Linear {
  const inDim = unit.length;
  return {
    inDim,
    outDim,
    apply(x, out) {
      out.fill(0);
      for (let j = 0; j < inDim; j++) out[unit[j]!]! += w[j]! * x[j]!;
    },
  };
}

/** Narrow → wide sparse map: output coordinate j = w[j]·x[unit[j]]. O(outDim). */
export function createGatherLinear(inDim: number, unit: Int32Array, w: Float32Array): Linear {
  const outDim = unit.length;
  return {
    inDim,
    outDim,
    apply(x, out) {
      for (let j = 0; j < outDim; j++) out[j] = w[j]! * x[unit[j]!]!;
    },
  };
}

/** Maps a token id to its embedding (length = hidden size), written into `out`. */
export interface Embedding {
  embed(id: number, out: Float32Array): void;
}

/** Maps the final-normed hidden state to logits over the whole vocabulary (`out`, length vocabSize). */
export interface Unembedding {
  readonly vocabSize: number;
  logits(h: Float32Array, out: Float32Array): void;
}

/**
 * logits = bias + table·proj(h) on the active ids; other ids keep their bias.
 * `proj` null means identity (rank = hidden size). `table` is (activeIds.length × rank), row-major.
 */
export function createLowRankUnembedding(opts: {
  vocabSize: number;
  rank: number;
  proj: Linear | null;
  table: Float32Array;
  activeIds: Int32Array;
  bias: Float32Array;
}): Unembedding {
  const { vocabSize, rank, proj, table, activeIds, bias } = opts;
  const z = new Float32Array(rank);
  if (table.length !== activeIds.length * rank) throw new Error("unembedding table size mismatch");
  if (bias.length !== vocabSize) throw new Error("unembedding bias size mismatch");
  return {
    vocabSize,
    logits(h, out) {
      let zz = h;
      if (proj) {
        proj.apply(h, z);
        zz = z;
      }
      out.set(bias);
      for (let a = 0; a < activeIds.length; a++) {
        let s = 0;
        const base = a * rank;
        for (let c = 0; c < rank; c++) s += table[base + c]! * zz[c]!;
        out[activeIds[a]!]! += s;
      }
    },
  };
}

/** A decoder layer with general (`Linear`) projections. */
export interface DenseLayerWeights {
  kind?: "dense";
  attnNorm: Float32Array;
  wq: Linear;
  wk: Linear;
  wv: Linear;
  wo: Linear;
  mlpNorm: Float32Array;
  wGate: Linear;
  wUp: Linear;
  wDown: Linear;
}

/**
 * A decoder layer with sparse projections (llama-8b preset), evaluated in fused O(hidden) passes.
 * With A = numHeads·headDim and F = mlpDim (both must divide hidden): residual coordinate j feeds
 * attention unit (j + qkvOffset) mod A with weights wq/wk/wv[j], and MLP unit (j + mlpOffset) mod F
 * with weights wGate/wUp[j]; it reads attention output (j + oOffset) mod A with weight wo[j] and
 * MLP output (j + downOffset) mod F with weight wDown[j]. All weight arrays have length hidden.
 */
export interface SparseLayerWeights {
  kind: "sparse";
  attnNorm: Float32Array;
  qkvOffset: number;
  wq: Float32Array;
  wk: Float32Array;
  wv: Float32Array;
  oOffset: number;
  wo: Float32Array;
  mlpNorm: Float32Array;
  mlpOffset: number;
  wGate: Float32Array;
  wUp: Float32Array;
  downOffset: number;
  wDown: Float32Array;
}

export type LayerWeights = DenseLayerWeights | SparseLayerWeights;

export interface ModelWeights {
  embedding: Embedding;
  layers: LayerWeights[];
  finalNorm: Float32Array;
  unembedding: Unembedding;
}

/** Shape of a model. Attention width = numHeads × headDim (no grouped KV heads). */
export interface ModelShape {
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  numHeads: number;
  headDim: number;
  mlpDim: number;
  ropeTheta: number;
  rmsEps: number;
}

/** Per-sequence key/value cache; grows as needed. `length` = positions processed so far. */
export interface KvCache {
  length: number;
  capacity: number;
  keys: Float32Array[];
  values: Float32Array[];
}

/**
 * Called after decoder layer `layer` has produced the residual stream `h` (length hidden) at absolute
 * position `pos`: steering may modify `h` in place; capture should copy it.
 */
export interface LayerHooks {
  afterLayer(layer: number, pos: number, h: Float32Array): void;
}

/** Result of a full forward pass (no sampling). */
export interface ForwardResult {
  /** residualStream[layer] is (positions × hidden) row-major, after that decoder layer (and its steering). */
  residualStream: Float32Array[];
  /** logits[pos] over the whole vocabulary (length vocabSize). */
  logits: Float32Array[];
}

export interface Model {
  readonly shape: ModelShape;
  createCache(capacity: number): KvCache;
  /**
   * Processes one token at position `cache.length` and appends to the cache.
   * Returns logits (a shared buffer, valid until the next call) when `wantLogits`, else null.
   */
  step(cache: KvCache, tokenId: number, hooks: LayerHooks | null, wantLogits: boolean): Float32Array | null;
  /** Full forward pass over `tokenIds` from position 0 with fresh cache. */
  forward(tokenIds: readonly number[], hooks?: LayerHooks | null): ForwardResult;
}

/** Creates a model from a shape and weights. */
export function createModel(shape: ModelShape, weights: ModelWeights): Model {
  const { hiddenSize: D, numLayers: L, numHeads: H, headDim: hd, mlpDim: F, vocabSize: V } = shape;
  const A = H * hd;
  const half = hd / 2;
  if (weights.layers.some((lw) => lw.kind === "sparse") && (D % A !== 0 || D % F !== 0)) {
    throw new Error("sparse layers need numHeads·headDim and mlpDim to divide hiddenSize");
  }
  if (!Number.isInteger(half)) throw new Error("headDim must be even");
  if (weights.layers.length !== L) throw new Error("layer count mismatch");
  const invFreq = new Float64Array(half);
  for (let i = 0; i < half; i++) invFreq[i] = 1 / shape.ropeTheta ** ((2 * i) / hd);

  // scratch buffers (the engine is single-threaded; step() is synchronous)
  const x = new Float32Array(D);
  const hn = new Float32Array(D);
  const q = new Float32Array(A);
  const k = new Float32Array(A);
  const v = new Float32Array(A);
  const att = new Float32Array(A);
  const tmpD = new Float32Array(D);
  const g = new Float32Array(F);
  const u = new Float32Array(F);
  const cos = new Float64Array(half);
  const sin = new Float64Array(half);
  let scores = new Float64Array(256);
  const logitsBuf = new Float32Array(V);
  const invSqrtHd = 1 / Math.sqrt(hd);

  const invRms = (src: Float32Array): number => {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += src[i]! * src[i]!;
    return 1 / Math.sqrt(ss / D + shape.rmsEps);
  };
  const rmsnorm = (src: Float32Array, gain: Float32Array, dst: Float32Array): void => {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += src[i]! * src[i]!;
    const inv = 1 / Math.sqrt(ss / D + shape.rmsEps);
    for (let i = 0; i < D; i++) dst[i] = src[i]! * inv * gain[i]!;
  };
  const rope = (vec: Float32Array): void => {
    for (let h = 0; h < H; h++) {
      const base = h * hd;
      for (let i = 0; i < half; i++) {
        const a = vec[base + i]!;
        const b = vec[base + i + half]!;
        vec[base + i] = a * cos[i]! - b * sin[i]!;
        vec[base + i + half] = b * cos[i]! + a * sin[i]!;
      }
    }
  };
  const grow = (cache: KvCache, need: number): void => {
    if (need <= cache.capacity) return;
    const cap = Math.max(need, cache.capacity * 2, 16);
    for (let l = 0; l < L; l++) {
      const nk = new Float32Array(cap * A);
      nk.set(cache.keys[l]!);
      cache.keys[l] = nk;
      const nv = new Float32Array(cap * A);
      nv.set(cache.values[l]!);
      cache.values[l] = nv;
    }
    cache.capacity = cap;
  };

  const model: Model = {
    shape,
    createCache(capacity) {
      const cap = Math.max(1, capacity);
      return {
        length: 0,
        capacity: cap,
        keys: Array.from({ length: L }, () => new Float32Array(cap * A)),
        values: Array.from({ length: L }, () => new Float32Array(cap * A)),
      };
    },
    step(cache, tokenId, hooks, wantLogits) {
      const pos = cache.length;
      grow(cache, pos + 1);
      for (let i = 0; i < half; i++) {
        const ang = pos * invFreq[i]!;
        cos[i] = Math.cos(ang);
        sin[i] = Math.sin(ang);
      }
      if (scores.length < pos + 1) scores = new Float64Array(Math.max(pos + 1, scores.length * 2));
      weights.embedding.embed(tokenId, x);
      for (let l = 0; l < L; l++) {
        const lw = weights.layers[l]!;
        if (lw.kind === "sparse") {
          const inv = invRms(x);
          const gain = lw.attnNorm;
          const wq = lw.wq;
          const wk = lw.wk;
          const wv = lw.wv;
          for (let s0 = 0; s0 < A; s0++) {
            let sq = 0;
            let sk = 0;
            let sv = 0;
            for (let j = s0; j < D; j += A) {
              const hj = x[j]! * gain[j]!;
              sq += wq[j]! * hj;
              sk += wk[j]! * hj;
              sv += wv[j]! * hj;
            }
            const uj = (s0 + lw.qkvOffset) % A;
            q[uj] = sq * inv;
            k[uj] = sk * inv;
            v[uj] = sv * inv;
          }
        } else {
          rmsnorm(x, lw.attnNorm, hn);
          lw.wq.apply(hn, q);
          lw.wk.apply(hn, k);
          lw.wv.apply(hn, v);
        }
        rope(q);
        rope(k);
        const keys = cache.keys[l]!;
        const vals = cache.values[l]!;
        keys.set(k, pos * A);
        vals.set(v, pos * A);
        for (let h = 0; h < H; h++) {
          const hb = h * hd;
          let max = -Infinity;
          for (let t = 0; t <= pos; t++) {
            const kb = t * A + hb;
            let s = 0;
            for (let i = 0; i < hd; i++) s += q[hb + i]! * keys[kb + i]!;
            s *= invSqrtHd;
            scores[t] = s;
            if (s > max) max = s;
          }
          let sum = 0;
          for (let t = 0; t <= pos; t++) {
            const e = Math.exp(scores[t]! - max);
            scores[t] = e;
            sum += e;
          }
          for (let i = 0; i < hd; i++) att[hb + i] = 0;
          for (let t = 0; t <= pos; t++) {
            const p = scores[t]! / sum;
            const vb = t * A + hb;
            for (let i = 0; i < hd; i++) att[hb + i]! += p * vals[vb + i]!;
          }
        }
        if (lw.kind === "sparse") {
          const wo = lw.wo;
          const oo = lw.oOffset;
          for (let s0 = 0; s0 < A; s0++) {
            const a = att[(s0 + oo) % A]!;
            for (let j = s0; j < D; j += A) x[j]! += wo[j]! * a;
          }
          const inv = invRms(x);
          const gain = lw.mlpNorm;
          const wg = lw.wGate;
          const wu = lw.wUp;
          for (let s0 = 0; s0 < F; s0++) {
            let sg = 0;
            let su = 0;
            for (let j = s0; j < D; j += F) {
              const hj = x[j]! * gain[j]!;
              sg += wg[j]! * hj;
              su += wu[j]! * hj;
            }
            const uj = (s0 + lw.mlpOffset) % F;
            g[uj] = sg * inv;
            u[uj] = su * inv;
          }
        } else {
          lw.wo.apply(att, tmpD);
          for (let i = 0; i < D; i++) x[i]! += tmpD[i]!;
          rmsnorm(x, lw.mlpNorm, hn);
          lw.wGate.apply(hn, g);
          lw.wUp.apply(hn, u);
        }
        for (let i = 0; i < F; i++) {
          const gi = g[i]!;
          g[i] = (gi / (1 + Math.exp(-gi))) * u[i]!;
        }
        if (lw.kind === "sparse") {
          const wd = lw.wDown;
          const od = lw.downOffset;
          for (let s0 = 0; s0 < F; s0++) {
            const a = g[(s0 + od) % F]!;
            for (let j = s0; j < D; j += F) x[j]! += wd[j]! * a;
          }
        } else {
          lw.wDown.apply(g, tmpD);
          for (let i = 0; i < D; i++) x[i]! += tmpD[i]!;
        }
        if (hooks) hooks.afterLayer(l, pos, x);
      }
      cache.length = pos + 1;
      if (!wantLogits) return null;
      rmsnorm(x, weights.finalNorm, hn);
      weights.unembedding.logits(hn, logitsBuf);
      return logitsBuf;
    },
    forward(tokenIds, hooks = null) {
      const n = tokenIds.length;
      const cache = model.createCache(n);
      const residualStream = Array.from({ length: L }, () => new Float32Array(n * D));
      const logits: Float32Array[] = [];
      const capture: LayerHooks = {
        afterLayer(layer, pos, h) {
          hooks?.afterLayer(layer, pos, h);
          residualStream[layer]!.set(h, pos * D);
        },
      };
      for (const id of tokenIds) logits.push(Float32Array.from(model.step(cache, id, capture, true)!));
      return { residualStream, logits };
    },
  };
  return model;
}
