// Signatures of the lens module, agreed between its users (REST decoder, service, upstream).
// Bodies are being written in this folder (issue 4); each throws until then.
import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import type { Tensor } from "../../gen/acs/v1/lens_pb.js";

/** Facts about a model that lens checks need. */
export interface LensModelFacts {
  /** Residual stream width (last dim of vectors and activations), e.g. 4096 for llama-8b. */
  hiddenSize: number;
  /** Decoder layers; valid indices are 0 … numLayers − 1. */
  numLayers: number;
  /** Longest prompt + completion in tokens; position indices must be below it. */
  maxModelLen: number;
}

/** A tensor as vllm-lens writes it in JSON. */
export interface VllmLensTensorJson {
  data: string;
  dtype: "float32" | "float16" | "int16";
  original_dtype?: string;
  shape: number[];
  compression?: "zstd" | null;
}

const todo = (name: string): never => {
  throw new Error(`lens.${name} is not implemented yet`);
};

/**
 * A REST tensor (nested number arrays, or the vllm-lens dict) → acs.v1.Tensor.
 * Throws ApiError 400 `invalid_request` with `param` (e.g. `apply_steering_vectors[0].activations`)
 * for a bad shape, dtype, base64, byte length, zstd stream or size.
 */
export function parseTensorJson(_value: unknown, _param: string): Tensor {
  return todo("parseTensorJson");
}

/** acs.v1.Tensor → the vllm-lens JSON dict (what REST responses carry). */
export function tensorToVllmLensJson(_tensor: Tensor): VllmLensTensorJson {
  return todo("tensorToVllmLensJson");
}

/** A vllm-lens JSON dict from Inference → acs.v1.Tensor. Throws ApiError 502 `upstream_error` when malformed. */
export function tensorFromVllmLensJson(_value: unknown): Tensor {
  return todo("tensorFromVllmLensJson");
}

/**
 * Checks output_residual_stream and apply_steering_vectors of a request against the model
 * (API.md §6): shapes, hidden size, layer and position ranges, finiteness, one prompt and n = 1,
 * and the capture cap layers × (prompt tokens + max_tokens) ≤ 2^25 / hidden.
 * Throws ApiError 400 `invalid_request` naming the param path.
 */
export function checkLensRequest(
  _request: CreateCompletionRequest,
  _model: LensModelFacts,
  _counts: { prompts: number; n: number; promptTokens: number; maxTokens: number },
): void {
  todo("checkLensRequest");
}

/**
 * The vllm_xargs entries for the lens fields of a request (JSON strings, which every vLLM
 * version accepts), or an empty object when the request has none.
 */
export function lensVllmXargs(_request: CreateCompletionRequest, _model: LensModelFacts): Record<string, string> {
  return todo("lensVllmXargs");
}
