/**
 * vllm-lens steering vectors: parsing (the checks vllm-lens makes) and the maths of src/upstream/vllm/VLLM.md.
 *
 * 2D vector v (layers × hidden) at layer l: every processed token t gets h[t] += scale·v[l].
 * 3D vector (layers × positions × hidden): vec[k] is added at absolute position position_indices[k]
 * (default k). norm_match: v' = v·‖h[t]‖/(‖v‖ + 1e-6), then h[t] += scale·v'.
 */
import { decodeNestedArray, decodeTensorDict } from "./tensor-codec.js";

/** One parsed steering vector. `data` is C order: (layers, hidden) or (layers, positions, hidden). */
export interface SteeringVector {
  layerIndices: number[];
  /** layer → row k of activations (first occurrence wins, like vllm-lens's layer_index_map). */
  layerMap: Map<number, number>;
  dims: 2 | 3;
  positions: number;
  hidden: number;
  data: Float32Array;
  scale: number;
  normMatch: boolean;
  positionIndices: number[] | null;
}

/** A request-level error that maps to an HTTP status with vLLM's envelope. */
export class EngineError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly type: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

const bad = (msg: string): EngineError => new EngineError(msg, 400, "BadRequestError");

/**
 * Parses the value of `apply_steering_vectors` (a JSON string of a list, or the list itself).
 * Checks what vllm-lens checks: each item's activations 2D or 3D, shape[0] == len(layer_indices),
 * layer indices in [0, numLayers). The hidden size is NOT checked (vllm-lens does not).
 * @throws EngineError (400) on malformed input.
 */
export async function parseSteeringVectors(
  value: unknown,
  numLayers: number,
  maxValues: number,
): Promise<SteeringVector[]> {
  let list: unknown = value;
  if (typeof value === "string") {
    try {
      list = JSON.parse(value);
    } catch {
      throw bad("apply_steering_vectors must be a JSON-encoded list of steering vectors");
    }
  }
  if (!Array.isArray(list)) throw bad("apply_steering_vectors must be a list of steering vectors");
  const out: SteeringVector[] = [];
  for (const item of list) {
    if (typeof item !== "object" || item === null || Array.isArray(item)) {
      throw bad("each steering vector must be an object");
    }
    const o = item as Record<string, unknown>;
    const layerIndices = o.layer_indices;
    if (!Array.isArray(layerIndices) || !layerIndices.every((x) => Number.isInteger(x))) {
      throw bad("steering vector layer_indices must be a list of integers");
    }
    const scale = o.scale ?? 1.0;
    if (typeof scale !== "number") throw bad("steering vector scale must be a number");
    const normMatch = o.norm_match ?? false;
    if (typeof normMatch !== "boolean") throw bad("steering vector norm_match must be a boolean");
    const pi = o.position_indices ?? null;
    if (pi !== null && (!Array.isArray(pi) || !pi.every((x) => Number.isInteger(x)))) {
      throw bad("steering vector position_indices must be a list of integers or null");
    }
    let tensor: { data: Float32Array; shape: number[] };
    try {
      const act = o.activations;
      if (typeof act === "object" && act !== null && !Array.isArray(act)) {
        tensor = await decodeTensorDict(act as Record<string, unknown>, maxValues);
      } else {
        tensor = decodeNestedArray(act, maxValues);
      }
    } catch (err) {
      throw bad(`invalid steering activations: ${(err as Error).message}`);
    }
    const shape = tensor.shape;
    if (shape.length !== 2 && shape.length !== 3) {
      throw bad(`Steering vector activations must be 2D or 3D, got ${shape.length}D`);
    }
    if (shape[0] !== layerIndices.length) {
      throw bad(`activations.shape[0] (${shape[0]}) must equal len(layer_indices) (${layerIndices.length})`);
    }
    for (const idx of layerIndices as number[]) {
      if (idx < 0 || idx >= numLayers) throw bad(`layer_index ${idx} out of range [0, ${numLayers})`);
    }
    const layerMap = new Map<number, number>();
    (layerIndices as number[]).forEach((l, k) => {
      if (!layerMap.has(l)) layerMap.set(l, k);
    });
    out.push({
      layerIndices: layerIndices as number[],
      layerMap,
      dims: shape.length as 2 | 3,
      positions: shape.length === 3 ? shape[1]! : 0,
      hidden: shape[shape.length - 1]!,
      data: tensor.data,
      scale,
      normMatch,
      positionIndices: pi as number[] | null,
    });
  }
  return out;
}

function norm(a: Float32Array, off: number, n: number): number {
  let s = 0;
  for (let i = 0; i < n; i++) s += a[off + i]! * a[off + i]!;
  return Math.sqrt(s);
}

function addScaled(h: Float32Array, src: Float32Array, off: number, factor: number): void {
  for (let i = 0; i < h.length; i++) h[i]! += src[off + i]! * factor;
}

/** Layers at which a vector with a wrong hidden size would fail (vllm-lens's hook raises there). */
export function badLayers(vectors: readonly SteeringVector[], hidden: number): number[] {
  const layers: number[] = [];
  for (const v of vectors) if (v.hidden !== hidden) layers.push(...v.layerMap.keys());
  return layers;
}

/** Applies every vector that targets `layer` to the residual `h` at absolute position `pos`, in order. */
export function applySteering(
  vectors: readonly SteeringVector[],
  layer: number,
  pos: number,
  h: Float32Array,
): void {
  const D = h.length;
  for (const v of vectors) {
    const k = v.layerMap.get(layer);
    if (k === undefined) continue;
    if (v.dims === 2) {
      const off = k * D;
      const f = v.normMatch ? (v.scale * norm(h, 0, D)) / (norm(v.data, off, D) + 1e-6) : v.scale;
      addScaled(h, v.data, off, f);
    } else {
      const n = v.positionIndices ? v.positionIndices.length : v.positions;
      for (let pi = 0; pi < n; pi++) {
        if (pi >= v.positions) break;
        const absPos = v.positionIndices ? v.positionIndices[pi]! : pi;
        if (absPos !== pos) continue;
        const off = (k * v.positions + pi) * D;
        const f = v.normMatch ? (v.scale * norm(h, 0, D)) / (norm(v.data, off, D) + 1e-6) : v.scale;
        addScaled(h, v.data, off, f);
      }
    }
  }
}
