// The lens checks of proto/API.md §6 that need the model's facts, before a request reaches
// Inference, complete on their own (protovalidate's rules are not assumed to have run). The
// service runs two steps at their places in its order of checks: checkLensShapes,
// checkCaptureCap. Several prompts and n > 1 are served by a fan-out (one Inference request per
// choice, src/service/lens-fan-out.ts), so neither field limits prompts or n.
//
// - output_residual_stream (param `output_residual_stream`): `true` or a non-empty list; indices
//   unique and in [0, numLayers); capture cap over the whole request: layers × Σ over its choices
//   of (prompt tokens + maxTokens) ≤ ⌊2^25 / hiddenSize⌋ (8,192 for llama-8b), the message naming
//   the numbers.
// - apply_steering_vectors: per vector i, param `apply_steering_vectors[i].…`: activations present, 2D or 3D, no empty dim, dim 0 =
//   len(layer_indices), last dim = hiddenSize, bytes matching the shape (zstd inflated with
//   bounded memory), every number finite (NaN/±Inf refused in bf16, f16 and f32);
//   layer_indices non-empty, unique, in range; position_indices only for 3D, length = dim 1, each
//   in [0, maxModelLen); scale finite. At most 2^25 numbers per vector and MAX_STEERING_NUMBERS in
//   all (param `apply_steering_vectors`), checked before decoding.
import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import { Compression, type SteeringVector, type Tensor } from "../../gen/acs/v1/lens_pb.js";
import { type ApiError, invalidRequest } from "../core/errors/index.js";
import type { SteeringBudget, SteeringLease } from "./steering-budget.js";
import {
  dtypeWidth,
  firstNonFinite,
  formatShape,
  isTensorDtype,
  MAX_TENSOR_ELEMENTS,
  rawBytesToFloat32,
  type TensorDtype,
  tensorElementCount,
  tensorRawBytes,
  unflattenIndex,
} from "./tensor-codec.js";
import { TensorRefusal } from "./tensor-refusal.js";

/** Facts about a model that lens checks need. */
export interface LensModelFacts {
  /** Residual stream width (last dim of vectors and activations), e.g. 4096 for llama-8b. */
  hiddenSize: number;
  /** Decoder layers; valid indices are 0 … numLayers − 1. */
  numLayers: number;
  /** Longest prompt + completion in tokens; position indices must be below it. */
  maxModelLen: number;
}

/** Token counts of a request that the capture cap needs. */
export interface LensRequestCounts {
  /** Prompts in the request (a string or token list is 1). */
  prompts: number;
  /** Choices per prompt. */
  n: number;
  /** Σ of the tokens of every prompt, each prompt counted once (as the Hold counts them). */
  promptTokens: number;
  /** max_tokens after defaults (and any Budget clamp). */
  maxTokens: number;
}

/** Most numbers one capture may hold (proto/API.md §6): layers × positions × hidden ≤ 2^25. */
export const MAX_CAPTURE_NUMBERS = 2 ** 25;

/**
 * Most numbers all steering vectors of one request may hold together: 2^23 (32 MiB as float32,
 * ~45 MB of base64 to Inference). Eight vectors over all 32 layers of Llama-3.1-8B (2^20
 * numbers, what an 8 MiB body holds) fit eight times over.
 */
export const MAX_STEERING_NUMBERS = 2 ** 23;

/** The most layers × (prompt tokens + max_tokens) one capture allows for `hiddenSize`. */
export function captureLayerTokenLimit(hiddenSize: number): number {
  return Math.floor(MAX_CAPTURE_NUMBERS / hiddenSize);
}

function invalid(param: string, message: string): ApiError {
  return invalidRequest(param, `Invalid value for '${param}': ${message}`);
}

/** Layer indices: integers, unique, each in [0, numLayers). */
function checkLayerIndices(param: string, indices: readonly number[], numLayers: number): void {
  const seen = new Set<number>();
  for (const index of indices) {
    if (!Number.isInteger(index) || index < 0 || index >= numLayers) {
      throw invalid(
        param,
        `layer index ${index} is out of range: the model has ${numLayers} layers, 0 … ${numLayers - 1}.`,
      );
    }
    if (seen.has(index)) throw invalid(param, `layer index ${index} appears more than once.`);
    seen.add(index);
  }
}

/** Layers one capture request covers (0 without output_residual_stream). */
export function captureLayers(request: CreateCompletionRequest, model: LensModelFacts): number {
  const capture = request.outputResidualStream;
  if (capture === undefined) return 0;
  return capture.allLayers ? model.numLayers : capture.layerIndices.length;
}

/**
 * The capture cap (proto/API.md §6, a size cap) over the whole request: layers × Σ over its choices of
 * (prompt tokens + maxTokens) ≤ ⌊2^25 / hidden⌋ (8,192 for llama-8b); a prompt's n choices each
 * count its tokens. Throws ApiError 400 `invalid_request`, param `output_residual_stream`, naming
 * the numbers, e.g. for one choice `… but 32 layers × (57 prompt tokens + 200 max_tokens) is
 * 8224.` and for several `… but 2 layers × (6 choices: 30 prompt tokens + 6 × 700 max_tokens) is
 * 8460.`
 */
export function checkCaptureCap(
  request: CreateCompletionRequest,
  model: LensModelFacts,
  counts: LensRequestCounts,
): void {
  const layers = captureLayers(request, model);
  if (layers === 0) return;
  const choices = counts.prompts * counts.n;
  const promptTokens = counts.n * counts.promptTokens;
  const tokens = promptTokens + choices * counts.maxTokens;
  const limit = captureLayerTokenLimit(model.hiddenSize);
  if (layers * tokens <= limit) return;
  if (choices === 1) {
    throw invalid(
      "output_residual_stream",
      `one capture holds at most 2^25 numbers, so layers × (prompt tokens + max_tokens) must be at most ${limit} for a hidden size of ${model.hiddenSize}, but ${layers} layers × (${counts.promptTokens} prompt tokens + ${counts.maxTokens} max_tokens) is ${layers * tokens}.`,
    );
  }
  throw invalid(
    "output_residual_stream",
    `one request captures at most 2^25 numbers in all, so layers × Σ over its choices of (prompt tokens + max_tokens) must be at most ${limit} for a hidden size of ${model.hiddenSize}, but ${layers} layers × (${choices} choices: ${promptTokens} prompt tokens + ${choices} × ${counts.maxTokens} max_tokens) is ${layers * tokens}.`,
  );
}

/** output_residual_stream: `true` or a non-empty list of unique layer indices in range. */
function checkCaptureLayers(request: CreateCompletionRequest, model: LensModelFacts): void {
  const capture = request.outputResidualStream;
  if (capture === undefined) return;
  const param = "output_residual_stream";
  if (capture.allLayers === capture.layerIndices.length > 0) {
    throw invalid(param, "must be true or a non-empty list of layer indices.");
  }
  checkLayerIndices(param, capture.layerIndices, model.numLayers);
}

/** The cheap checks of one SteeringVector (no decoding); returns its number of elements. */
function checkVectorShape(base: string, vector: SteeringVector, model: LensModelFacts): number {
  const param = `${base}.activations`;
  const tensor = vector.activations;
  if (tensor === undefined) throw invalidRequest(param, `Missing required parameter: '${param}'.`);
  if (!isTensorDtype(tensor.dtype)) {
    throw invalid(param, `dtype ${tensor.dtype} is not one of BFLOAT16, FLOAT16, FLOAT32.`);
  }
  if (tensor.compression !== Compression.UNSPECIFIED && tensor.compression !== Compression.ZSTD) {
    throw invalid(param, `compression ${tensor.compression} is not one of UNSPECIFIED, ZSTD.`);
  }
  const shape = tensor.shape;
  if (shape.length !== 2 && shape.length !== 3) {
    throw invalid(
      param,
      `must be 2D (layers, hidden) or 3D (layers, positions, hidden), but its shape is ${formatShape(shape)}.`,
    );
  }
  if (shape.some((dim) => dim < 1))
    throw invalid(param, `shape ${formatShape(shape)} has an empty dimension.`);
  const layersParam = `${base}.layer_indices`;
  if (vector.layerIndices.length === 0) {
    throw invalid(layersParam, "must list at least one layer index.");
  }
  checkLayerIndices(layersParam, vector.layerIndices, model.numLayers);
  if (shape[0] !== vector.layerIndices.length) {
    throw invalid(
      param,
      `dim 0 of shape ${formatShape(shape)} is ${shape[0]}, but layer_indices lists ${vector.layerIndices.length} layer${vector.layerIndices.length === 1 ? "" : "s"}; they must be equal.`,
    );
  }
  const hidden = shape[shape.length - 1];
  if (hidden !== model.hiddenSize) {
    throw invalid(
      param,
      `the last dim of shape ${formatShape(shape)} is ${hidden}, but the model's hidden size is ${model.hiddenSize}.`,
    );
  }
  const positionsParam = `${base}.position_indices`;
  const positions = vector.positionIndices;
  if (positions.length > 0) {
    if (shape.length !== 3) {
      throw invalid(
        positionsParam,
        `is only for 3D activations (layers, positions, hidden), but the shape is ${formatShape(shape)}.`,
      );
    }
    if (positions.length !== shape[1]) {
      throw invalid(
        positionsParam,
        `has ${positions.length} entries, but dim 1 of activations shape ${formatShape(shape)} is ${shape[1]}; they must be equal.`,
      );
    }
    for (const position of positions) {
      if (!Number.isInteger(position) || position < 0 || position >= model.maxModelLen) {
        throw invalid(
          positionsParam,
          `position ${position} is out of range: positions are 0 … ${model.maxModelLen - 1} (max_model_len ${model.maxModelLen}).`,
        );
      }
    }
  }
  if (vector.scale !== undefined && !Number.isFinite(vector.scale)) {
    throw invalid(`${base}.scale`, `must be a finite number, not ${vector.scale}.`);
  }
  try {
    return tensorElementCount(shape, MAX_TENSOR_ELEMENTS);
  } catch (err) {
    if (err instanceof TensorRefusal) throw invalid(param, `${err.message}.`);
    throw err;
  }
}

/**
 * Decodes a checked tensor's bytes and refuses a byte-length mismatch, bad zstd, NaN or ±Inf;
 * returns the raw little-endian bytes in the tensor's dtype (inflated).
 */
function checkVectorValues(param: string, tensor: Tensor): Uint8Array {
  let raw: Uint8Array;
  try {
    raw = tensorRawBytes(tensor);
  } catch (err) {
    if (err instanceof TensorRefusal) throw invalid(param, `${err.message}.`);
    throw err;
  }
  const dtype = tensor.dtype;
  if (!isTensorDtype(dtype)) return raw; // checked before
  const bad = firstNonFinite(raw, dtype);
  if (bad >= 0) {
    const width = dtypeWidth(dtype);
    const value = rawBytesToFloat32(raw.subarray(bad * width, (bad + 1) * width), dtype)[0];
    throw invalid(
      param,
      `every number must be finite, but element ${formatShape(unflattenIndex(bad, tensor.shape))} is ${value}.`,
    );
  }
  return raw;
}

function checkSteering(
  request: CreateCompletionRequest,
  model: LensModelFacts,
  lease: Pick<SteeringLease, "reserve"> | undefined,
): Uint8Array[] {
  const vectors = request.applySteeringVectors;
  if (vectors.length === 0) return [];
  let total = 0;
  let bytes = 0;
  vectors.forEach((vector, i) => {
    const elements = checkVectorShape(`apply_steering_vectors[${i}]`, vector, model);
    total += elements;
    bytes += elements * dtypeWidth(vector.activations!.dtype as TensorDtype); // dtype checked
  });
  if (total > MAX_STEERING_NUMBERS) {
    throw invalid(
      "apply_steering_vectors",
      `the steering vectors hold ${total} numbers in all, more than the ${MAX_STEERING_NUMBERS} (2^23) one request may send.`,
    );
  }
  lease?.reserve(bytes); // before a single byte is inflated
  return vectors.map((vector, i) =>
    checkVectorValues(`apply_steering_vectors[${i}].activations`, vector.activations!),
  );
}

/**
 * The checks of capture and steering that need the model but no token counts: capture layer
 * indices; every SteeringVector's shape, indices, positions, scale, bytes and finiteness; the
 * total of steering numbers. Throws ApiError 400 `invalid_request` naming the param path.
 * Returns each steering vector's raw bytes (inflated, in its dtype), for {@link lensVllmXargs}, so
 * that a tensor is decoded once per request.
 *
 * With a `lease` (of a {@link SteeringBudget}), the decoded size of all vectors (elements × the
 * dtype's width) is reserved on it after the shape checks and before any tensor is decoded, so its
 * 413 `request_too_large` / 429 `rate_limited` comes before the memory is taken. The caller
 * releases the lease when the request is done.
 */
export function checkLensShapes(
  request: CreateCompletionRequest,
  model: LensModelFacts,
  lease?: Pick<SteeringLease, "reserve">,
): Uint8Array[] {
  checkCaptureLayers(request, model);
  return checkSteering(request, model, lease);
}
