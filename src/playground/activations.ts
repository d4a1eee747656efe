// Residual-stream arithmetic of the playground, on decoded tensors (no DOM): norms per
// layer × position for the heatmap, and the contrastive steering vector (difference of mean
// activations of two lists of prompts) in the API's SteeringVector JSON (proto/API.md §6).
import type { SteeringVectorJson } from "./api.js";
import type { DecodedTensor } from "./tensor.js";

/** L2 norms of a residual stream of shape (layers, positions, hidden): a (layers × positions) row-major array. */
export function residualNorms(stream: DecodedTensor): {
  norms: Float32Array;
  layers: number;
  positions: number;
} {
  const [layers = 0, positions = 0, hidden = 0] = stream.shape;
  if (stream.shape.length !== 3)
    throw new Error(`a residual stream has 3 dims, not [${stream.shape.join(", ")}]`);
  const norms = new Float32Array(layers * positions);
  for (let row = 0; row < layers * positions; row++) {
    let sum = 0;
    const base = row * hidden;
    for (let j = 0; j < hidden; j++) {
      const v = stream.values[base + j]!;
      sum += v * v;
    }
    norms[row] = Math.sqrt(sum);
  }
  return { norms, layers, positions };
}

/** The hidden vector at (layer row, position) of a (layers, positions, hidden) stream. */
export function residualAt(stream: DecodedTensor, layerRow: number, position: number): Float32Array {
  const positions = stream.shape[1]!;
  const hidden = stream.shape[2]!;
  const start = (layerRow * positions + position) * hidden;
  return stream.values.subarray(start, start + hidden);
}

/**
 * Mean over prompts of each prompt's mean over its positions, for one captured layer: each
 * stream has shape (1, positions, hidden). Returns a vector of `hidden` numbers.
 */
export function meanActivation(streams: readonly DecodedTensor[]): Float64Array {
  if (streams.length === 0) throw new Error("no prompts");
  const hidden = streams[0]!.shape[2]!;
  const mean = new Float64Array(hidden);
  for (const stream of streams) {
    const [layers, positions = 0, width] = stream.shape;
    if (layers !== 1 || width !== hidden || positions === 0) {
      throw new Error(`expected a (1, positions, ${hidden}) stream, got [${stream.shape.join(", ")}]`);
    }
    for (let p = 0; p < positions; p++) {
      for (let j = 0; j < hidden; j++)
        mean[j]! += stream.values[p * hidden + j]! / positions / streams.length;
    }
  }
  return mean;
}

/** mean(positive) − mean(negative): the contrastive activation addition vector. */
export function contrastiveVector(
  positive: readonly DecodedTensor[],
  negative: readonly DecodedTensor[],
): Float64Array {
  const a = meanActivation(positive);
  const b = meanActivation(negative);
  if (a.length !== b.length) throw new Error("the two lists were captured with different hidden sizes");
  return a.map((v, j) => v - b[j]!);
}

/** L2 norm of a vector. */
export function vectorNorm(vector: ArrayLike<number>): number {
  let sum = 0;
  for (let j = 0; j < vector.length; j++) sum += vector[j]! * vector[j]!;
  return Math.sqrt(sum);
}

/** A 2D SteeringVector (1 layer × hidden, broadcast to every position) in the API's JSON. */
export function steeringVectorJson(
  vector: ArrayLike<number>,
  layer: number,
  scale: number,
  normMatch: boolean,
): SteeringVectorJson {
  return { activations: [Array.from(vector)], layer_indices: [layer], scale, norm_match: normMatch };
}
