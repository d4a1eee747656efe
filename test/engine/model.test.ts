/**
 * The model's maths, checked against an independent naive implementation (no KV cache, plain
 * number arrays), plus causality and the steering maths of src/upstream/vllm/VLLM.md.
 */
import { describe, expect, it } from "vitest";
import { loadPreset } from "../../src/engine/index.js";
import {
  createDenseLinear,
  createLowRankUnembedding,
  createModel,
  type LayerHooks,
  type ModelShape,
} from "../../src/engine/model.js";
import { createRng } from "../../src/engine/prng.js";
import { applySteering, parseSteeringVectors } from "../../src/engine/steering.js";

type Mat = number[][];

function randMat(rng: ReturnType<typeof createRng>, rows: number, cols: number, std: number): Mat {
  return Array.from({ length: rows }, () => Array.from({ length: cols }, () => rng.gaussian() * std));
}
const flat = (m: Mat): Float32Array => Float32Array.from(m.flat());
const mv = (m: Mat, x: number[]): number[] => m.map((row) => row.reduce((s, w, i) => s + w * x[i]!, 0));
const f32 = (xs: number[]): number[] => Array.from(Float32Array.from(xs));

interface NaiveLayer {
  attnNorm: number[];
  wq: Mat;
  wk: Mat;
  wv: Mat;
  wo: Mat;
  mlpNorm: number[];
  wg: Mat;
  wu: Mat;
  wd: Mat;
}

/** A hand-set model: weights as plain arrays, so the test can compute logits on its own. */
function handModel(shape: ModelShape, seed: string) {
  const rng = createRng(seed);
  const { hiddenSize: D, numHeads: H, headDim: hd, mlpDim: F, vocabSize: V } = shape;
  const A = H * hd;
  const emb = randMat(rng, V, D, 1);
  const layers: NaiveLayer[] = Array.from({ length: shape.numLayers }, () => ({
    attnNorm: Array.from({ length: D }, () => 1 + 0.1 * rng.gaussian()),
    wq: randMat(rng, A, D, 0.5),
    wk: randMat(rng, A, D, 0.5),
    wv: randMat(rng, A, D, 0.5),
    wo: randMat(rng, D, A, 0.5),
    mlpNorm: Array.from({ length: D }, () => 1 + 0.1 * rng.gaussian()),
    wg: randMat(rng, F, D, 0.5),
    wu: randMat(rng, F, D, 0.5),
    wd: randMat(rng, D, F, 0.5),
  }));
  const finalNorm = Array.from({ length: D }, () => 1);
  const unemb = randMat(rng, V, D, 0.7);
  const bias = Array.from({ length: V }, (_, i) => i * 0.01);
  const model = createModel(shape, {
    embedding: { embed: (id, out) => out.set(emb[id]!) },
    layers: layers.map((l) => ({
      attnNorm: Float32Array.from(l.attnNorm),
      wq: createDenseLinear(A, D, flat(l.wq)),
      wk: createDenseLinear(A, D, flat(l.wk)),
      wv: createDenseLinear(A, D, flat(l.wv)),
      wo: createDenseLinear(D, A, flat(l.wo)),
      mlpNorm: Float32Array.from(l.mlpNorm),
      wGate: createDenseLinear(F, D, flat(l.wg)),
      wUp: createDenseLinear(F, D, flat(l.wu)),
      wDown: createDenseLinear(D, F, flat(l.wd)),
    })),
    finalNorm: Float32Array.from(finalNorm),
    unembedding: createLowRankUnembedding({
      vocabSize: V,
      rank: D,
      proj: null,
      table: flat(unemb),
      activeIds: Int32Array.from({ length: V }, (_, i) => i),
      bias: Float32Array.from(bias),
    }),
  });
  /** Naive full recompute: every position attends to all earlier positions, recomputed from scratch. */
  const naive = (ids: number[]): { logits: number[][]; resid: number[][][] } => {
    const rms = (x: number[], g: number[]) => {
      const ms = x.reduce((s, v) => s + v * v, 0) / D;
      return x.map((v, i) => (v / Math.sqrt(ms + shape.rmsEps)) * g[i]!);
    };
    const rope = (v: number[], pos: number) => {
      const out = [...v];
      for (let h = 0; h < H; h++) {
        for (let i = 0; i < hd / 2; i++) {
          const ang = pos / shape.ropeTheta ** ((2 * i) / hd);
          const a = v[h * hd + i]!;
          const b = v[h * hd + i + hd / 2]!;
          out[h * hd + i] = a * Math.cos(ang) - b * Math.sin(ang);
          out[h * hd + i + hd / 2] = b * Math.cos(ang) + a * Math.sin(ang);
        }
      }
      return out;
    };
    let xs = ids.map((id) => [...emb[id]!]);
    const resid: number[][][] = [];
    for (const l of layers) {
      const hn = xs.map((x) => rms(x, l.attnNorm));
      const qs = hn.map((h, p) => rope(mv(l.wq, h), p));
      const ks = hn.map((h, p) => rope(mv(l.wk, h), p));
      const vs = hn.map((h) => mv(l.wv, h));
      xs = xs.map((x, p) => {
        const att = new Array<number>(A).fill(0);
        for (let h = 0; h < H; h++) {
          const sc: number[] = [];
          for (let t = 0; t <= p; t++) {
            let s = 0;
            for (let i = 0; i < hd; i++) s += qs[p]![h * hd + i]! * ks[t]![h * hd + i]!;
            sc.push(s / Math.sqrt(hd));
          }
          const m = Math.max(...sc);
          const e = sc.map((s) => Math.exp(s - m));
          const z = e.reduce((a, b) => a + b, 0);
          for (let t = 0; t <= p; t++)
            for (let i = 0; i < hd; i++) att[h * hd + i]! += (e[t]! / z) * vs[t]![h * hd + i]!;
        }
        const o = mv(l.wo, att);
        return x.map((v, i) => v + o[i]!);
      });
      xs = xs.map((x) => {
        const h = rms(x, l.mlpNorm);
        const g = mv(l.wg, h);
        const u = mv(l.wu, h);
        const a = g.map((gi, i) => (gi / (1 + Math.exp(-gi))) * u[i]!);
        const d = mv(l.wd, a);
        return x.map((v, i) => v + d[i]!);
      });
      resid.push(xs.map((x) => [...x]));
    }
    const logits = xs.map((x) => {
      const h = rms(x, finalNorm);
      return mv(unemb, h).map((v, i) => v + bias[i]!);
    });
    return { logits, resid };
  };
  return { model, naive };
}

const close = (a: ArrayLike<number>, b: ArrayLike<number>, tol: number): void => {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!));
  expect(worst).toBeLessThan(tol);
};

describe("model maths", () => {
  it("a hand-set 1-layer model gives the logits computed independently", () => {
    const shape: ModelShape = {
      vocabSize: 7,
      hiddenSize: 8,
      numLayers: 1,
      numHeads: 2,
      headDim: 4,
      mlpDim: 6,
      ropeTheta: 10000,
      rmsEps: 1e-5,
    };
    const { model, naive } = handModel(shape, "hand-1");
    const ids = [3, 1, 4, 1, 5, 6, 2];
    const want = naive(ids);
    const got = model.forward(ids);
    for (let p = 0; p < ids.length; p++) close(got.logits[p]!, f32(want.logits[p]!), 1e-4);
  });

  it("KV-cache decode equals a full recompute at every position (2 layers)", () => {
    const shape: ModelShape = {
      vocabSize: 11,
      hiddenSize: 12,
      numLayers: 2,
      numHeads: 3,
      headDim: 4,
      mlpDim: 10,
      ropeTheta: 500,
      rmsEps: 1e-5,
    };
    const { model, naive } = handModel(shape, "hand-2");
    const ids = [0, 5, 10, 3, 3, 7, 1, 9, 2, 8];
    const cache = model.createCache(1);
    for (let p = 0; p < ids.length; p++) {
      const logits = model.step(cache, ids[p]!, null, true)!;
      const full = naive(ids.slice(0, p + 1));
      close(logits, f32(full.logits[p]!), 1e-4);
    }
  });

  it("causality: changing token p never changes activations at positions < p (tiny preset)", () => {
    const { model } = loadPreset("tiny");
    const D = model.shape.hiddenSize;
    const a = [256, 72, 101, 108, 108, 111, 32, 119, 111, 114];
    for (const p of [1, 4, 9]) {
      const b = [...a];
      b[p] = (b[p]! + 17) % 256;
      const ra = model.forward(a).residualStream;
      const rb = model.forward(b).residualStream;
      for (let l = 0; l < model.shape.numLayers; l++) {
        expect(Array.from(rb[l]!.subarray(0, p * D))).toEqual(Array.from(ra[l]!.subarray(0, p * D)));
        expect(Array.from(rb[l]!.subarray(p * D, (p + 1) * D))).not.toEqual(
          Array.from(ra[l]!.subarray(p * D, (p + 1) * D)),
        );
      }
    }
  });
});

describe("steering maths", () => {
  const { model } = loadPreset("tiny");
  const D = model.shape.hiddenSize;
  const ids = [256, 84, 104, 101, 32, 114, 97, 98, 98, 105, 116];
  const vec = (seed: string) => Array.from({ length: D }, (_, i) => Math.sin(i + seed.length) * 0.5);

  async function steered(spec: unknown, probeLayer: number) {
    const vs = await parseSteeringVectors(JSON.stringify(spec), model.shape.numLayers, 1 << 20);
    const pre: Float32Array[] = [];
    const post: Float32Array[] = [];
    const hooks: LayerHooks = {
      afterLayer(layer, _pos, h) {
        if (layer === probeLayer) pre.push(Float32Array.from(h));
        applySteering(vs, layer, _pos, h);
        if (layer === probeLayer) post.push(Float32Array.from(h));
      },
    };
    return { result: model.forward(ids, hooks), pre, post };
  }

  it("scale 0 reproduces the unsteered residual stream and logits", async () => {
    const base = model.forward(ids);
    const { result } = await steered(
      [{ activations: [vec("a"), vec("b")], layer_indices: [1, 2], scale: 0 }],
      1,
    );
    for (let l = 0; l < model.shape.numLayers; l++)
      expect(Array.from(result.residualStream[l]!)).toEqual(Array.from(base.residualStream[l]!));
    expect(Array.from(result.logits.at(-1)!)).toEqual(Array.from(base.logits.at(-1)!));
  });

  it("2D: every token gets scale·v at the layer; later layers change; earlier layers do not", async () => {
    const base = model.forward(ids);
    const v = vec("x");
    const { result, pre, post } = await steered([{ activations: [v], layer_indices: [2], scale: 3 }], 2);
    pre.forEach((h, t) => {
      const want = Array.from(h, (x, i) => Math.fround(x + 3 * Math.fround(v[i]!)));
      close(post[t]!, want, 1e-5);
    });
    expect(Array.from(result.residualStream[1]!)).toEqual(Array.from(base.residualStream[1]!));
    expect(Array.from(result.residualStream[3]!)).not.toEqual(Array.from(base.residualStream[3]!));
  });

  it("norm_match adds exactly scale·‖h‖ per token", async () => {
    const { pre, post } = await steered(
      [{ activations: [vec("n")], layer_indices: [0], scale: 0.5, norm_match: true }],
      0,
    );
    expect(pre.length).toBe(ids.length);
    pre.forEach((h, t) => {
      const hn = Math.hypot(...h);
      const added = Math.hypot(...Array.from(post[t]!, (x, i) => x - h[i]!));
      expect(Math.abs(added - 0.5 * hn) / hn).toBeLessThan(1e-5);
    });
  });

  it("3D: a vector at position p leaves positions < p unchanged (and changes p)", async () => {
    const base = model.forward(ids);
    const p = 6;
    const { result } = await steered(
      [{ activations: [[vec("p")]], layer_indices: [1], position_indices: [p], scale: 2 }],
      1,
    );
    for (let l = 0; l < model.shape.numLayers; l++) {
      expect(Array.from(result.residualStream[l]!.subarray(0, p * D))).toEqual(
        Array.from(base.residualStream[l]!.subarray(0, p * D)),
      );
    }
    expect(Array.from(result.residualStream[1]!.subarray(p * D, (p + 1) * D))).not.toEqual(
      Array.from(base.residualStream[1]!.subarray(p * D, (p + 1) * D)),
    );
  });

  it("3D default positions are 0…k−1", async () => {
    const { pre, post } = await steered([{ activations: [[vec("a"), vec("b")]], layer_indices: [3] }], 3);
    for (let t = 0; t < ids.length; t++) {
      const delta = Array.from(post[t]!, (x, i) => x - pre[t]![i]!);
      const norm = Math.hypot(...delta);
      if (t < 2) expect(norm).toBeGreaterThan(0.1);
      else expect(norm).toBe(0);
    }
  });
});
