/**
 * Builds a preset's weights from a seeded PRNG (identical on every machine; no weight files).
 * tiny: dense matrices. llama-8b: sparse projections (each residual coordinate feeds one inner
 * unit, each residual coordinate reads one inner unit), a hashed embedding and a low-rank
 * unembedding over an active sub-vocabulary; every other token keeps a fixed logit, so
 * log-softmax stays exact over all 128256 tokens.
 */
import { CORPUS } from "./corpus.js";
import {
  createDenseLinear,
  createLowRankUnembedding,
  createScatterLinear,
  type Embedding,
  type LayerWeights,
  type Linear,
  type ModelShape,
  type ModelWeights,
} from "./model.js";
import type { PresetDims } from "./presets.js";
import { createRng, type Rng } from "./prng.js";
import type { Tokenizer } from "./tokenizer.js";

function gaussianArray(rng: Rng, n: number, std: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.gaussian() * std;
  return a;
}

function gainArray(rng: Rng, n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = 1 + 0.05 * rng.gaussian();
  return a;
}

/** Wide → narrow: every input coordinate feeds one random output unit with weight ±scale. */
function scatterLinear(rng: Rng, outDim: number, inDim: number, scale: number): Linear {
  const unit = new Int32Array(inDim);
  const w = new Float32Array(inDim);
  for (let j = 0; j < inDim; j++) {
    unit[j] = rng.nextU32() % outDim;
    w[j] = rng.next() < 0.5 ? -scale : scale;
  }
  return createScatterLinear(outDim, unit, w);
}

function denseLinear(rng: Rng, outDim: number, inDim: number, std: number): Linear {
  return createDenseLinear(outDim, inDim, gaussianArray(rng, outDim * inDim, std));
}

/** Token counts of the corpus under `tok` (no BOS). */
function corpusCounts(tok: Tokenizer): Map<number, number> {
  const counts = new Map<number, number>();
  for (const id of tok.encode(CORPUS, false)) counts.set(id, (counts.get(id) ?? 0) + 1);
  return counts;
}

/** The model shape of a preset. */
export function shapeOf(p: PresetDims): ModelShape {
  return {
    vocabSize: p.vocabSize,
    hiddenSize: p.hiddenSize,
    numLayers: p.numLayers,
    numHeads: p.numHeads,
    headDim: p.headDim,
    mlpDim: p.mlpDim,
    ropeTheta: p.ropeTheta,
    rmsEps: p.rmsEps,
  };
}

/** Builds the weights of preset `p` for tokenizer `tok` (deterministic in `p.seed`). */
export function buildPresetWeights(p: PresetDims, tok: Tokenizer): ModelWeights {
  const rng = createRng(`weights:${p.seed}`);
  const D = p.hiddenSize;
  const A = p.numHeads * p.headDim;
  const F = p.mlpDim;
  const V = p.vocabSize;
  const sparse = p.projection === "sparse";

  let embedding: Embedding;
  if (sparse) {
    const cache = new Map<number, Float32Array>();
    embedding = {
      embed(id, out) {
        let e = cache.get(id);
        if (!e) {
          e = gaussianArray(createRng(`embed:${p.seed}:${id}`), D, 1);
          if (cache.size >= 4096) cache.clear();
          cache.set(id, e);
        }
        out.set(e);
      },
    };
  } else {
    const table = gaussianArray(rng, V * D, 1);
    embedding = {
      embed(id, out) {
        out.set(table.subarray(id * D, id * D + D));
      },
    };
  }

  const layers: LayerWeights[] = [];
  for (let l = 0; l < p.numLayers; l++) {
    if (sparse) {
      const signs = (n: number, scale: number): Float32Array => {
        const a = new Float32Array(n);
        for (let j = 0; j < n; j++) a[j] = rng.next() < 0.5 ? -scale : scale;
        return a;
      };
      const inA = 1 / Math.sqrt(D / A);
      const inF = 1 / Math.sqrt(D / F);
      layers.push({
        kind: "sparse",
        attnNorm: gainArray(rng, D),
        qkvOffset: rng.nextU32() % A,
        wq: signs(D, inA),
        wk: signs(D, inA),
        wv: signs(D, inA),
        oOffset: rng.nextU32() % A,
        wo: gaussianArray(rng, D, 0.3),
        mlpNorm: gainArray(rng, D),
        mlpOffset: rng.nextU32() % F,
        wGate: signs(D, inF),
        wUp: signs(D, inF),
        downOffset: rng.nextU32() % F,
        wDown: gaussianArray(rng, D, 0.3),
      });
    } else {
      layers.push({
        attnNorm: gainArray(rng, D),
        wq: denseLinear(rng, A, D, 1 / Math.sqrt(D)),
        wk: denseLinear(rng, A, D, 1 / Math.sqrt(D)),
        wv: denseLinear(rng, A, D, 1 / Math.sqrt(D)),
        wo: denseLinear(rng, D, A, 0.5 / Math.sqrt(A)),
        mlpNorm: gainArray(rng, D),
        wGate: denseLinear(rng, F, D, 1 / Math.sqrt(D)),
        wUp: denseLinear(rng, F, D, 1 / Math.sqrt(D)),
        wDown: denseLinear(rng, D, F, 0.5 / Math.sqrt(F)),
      });
    }
  }
  const finalNorm = gainArray(rng, D);

  // Unigram bias: log frequency in the corpus, with floors for unseen tokens.
  const counts = corpusCounts(tok);
  let total = 0;
  for (const c of counts.values()) total += c;
  const r = p.unembedRank;
  const active = new Set<number>(counts.keys());
  active.add(tok.eosId);
  for (let id = 0; active.size < Math.min(p.activeVocab, V) && id < V; id++) {
    if (!tok.isSpecial(id)) active.add(id);
  }
  const activeIds = Int32Array.from([...active].sort((a, b) => a - b));
  const bias = new Float32Array(V);
  const restFloor = sparse ? Math.log(0.0001 / total) : Math.log(0.002 / total);
  bias.fill(restFloor);
  for (const id of activeIds) bias[id] = Math.log(((counts.get(id) ?? 0) + 0.02) / total);
  for (let id = 0; id < V; id++) if (tok.isSpecial(id)) bias[id] = -30;
  bias[tok.eosId] = Math.log(1 / 300);
  const logitStd = sparse ? 2 : 1.5;
  const table = gaussianArray(rng, activeIds.length * r, logitStd / Math.sqrt(r));
  const proj = sparse ? scatterLinear(rng, r, D, 1 / Math.sqrt(D / r)) : null;
  if (!sparse && r !== D) throw new Error("dense presets use unembedRank = hiddenSize");
  const unembedding = createLowRankUnembedding({ vocabSize: V, rank: r, proj, table, activeIds, bias });
  return { embedding, layers, finalNorm, unembedding };
}
