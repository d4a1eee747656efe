import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { Compression, Dtype, type SteeringVectorSchema, type Tensor } from "../../gen/acs/v1/lens_pb.js";
import {
  captureLayerTokenLimit,
  checkCaptureCap,
  checkLensShapes,
  encodeTensor,
  type LensModelFacts,
  type LensRequestCounts,
  MAX_STEERING_NUMBERS,
} from "../../src/lens/index.js";
import { expectApiError } from "./api-error-expect.js";

/** The service's two lens steps, in its order of checks (src/service/completions/check-order.ts). */
function checkLensRequest(
  request: Parameters<typeof checkLensShapes>[0],
  model: LensModelFacts,
  counts: LensRequestCounts,
): void {
  checkLensShapes(request, model);
  checkCaptureCap(request, model, counts);
}

/** A small model: hidden 8, 4 layers, 64 positions. */
const small: LensModelFacts = { hiddenSize: 8, numLayers: 4, maxModelLen: 64 };
/** llama-8b's facts (proto/API.md §6). */
const llama: LensModelFacts = { hiddenSize: 4096, numLayers: 32, maxModelLen: 131072 };
const one: LensRequestCounts = { prompts: 1, n: 1, promptTokens: 5, maxTokens: 10 };

type VectorInit = MessageInitShape<typeof SteeringVectorSchema>;

const ones = (count: number, value = 0.5): number[] => new Array(count).fill(value);
/** A finite f32 tensor of `shape`. */
const tensor = (shape: number[], options: Parameters<typeof encodeTensor>[2] = {}): Tensor =>
  encodeTensor(ones(shape.reduce((a, b) => a * b, 1)), shape, options);
/** `shape` with the number at `at` replaced by `bad`. */
const withValue = (
  shape: number[],
  at: number,
  bad: number,
  options: Parameters<typeof encodeTensor>[2] = {},
): Tensor => {
  const values = ones(shape.reduce((a, b) => a * b, 1));
  values[at] = bad;
  return encodeTensor(values, shape, options);
};
/** An empty-data tensor (for checks that must refuse before decoding). */
const hollow = (shape: number[]): Tensor => ({ ...tensor([1]), shape, data: new Uint8Array(0) });

const vector = (init: VectorInit = {}): VectorInit => ({
  activations: tensor([1, 8]),
  layerIndices: [2],
  ...init,
});

function request(init: MessageInitShape<typeof CreateCompletionRequestSchema> = {}) {
  return create(CreateCompletionRequestSchema, {
    model: "m",
    prompt: { case: "text", value: "The sky is" },
    ...init,
  });
}

const steer = (...vectors: VectorInit[]) => request({ applySteeringVectors: vectors });
const capture = (layerIndices: number[], allLayers = false) =>
  request({ outputResidualStream: { allLayers, layerIndices } });

describe("checkLensRequest accepts", () => {
  const accepted: Array<[string, ReturnType<typeof request>, LensModelFacts, LensRequestCounts]> = [
    [
      "no lens fields, many prompts and n",
      request(),
      small,
      { prompts: 3, n: 4, promptTokens: 9, maxTokens: 9 },
    ],
    ["a capture of two layers", capture([3, 0]), small, one],
    ["a capture of all layers", capture([], true), small, one],
    [
      "llama-8b: all 32 layers for 256 tokens",
      capture([], true),
      llama,
      { prompts: 1, n: 1, promptTokens: 56, maxTokens: 200 },
    ],
    [
      "llama-8b: 1 layer for 8192 tokens",
      capture([31]),
      llama,
      { prompts: 1, n: 1, promptTokens: 8000, maxTokens: 192 },
    ],
    ["a 2D vector", steer(vector()), small, one],
    [
      "a 2D vector over 3 layers, scale 0, norm_match",
      steer(vector({ activations: tensor([3, 8]), layerIndices: [3, 0, 1], scale: 0, normMatch: true })),
      small,
      one,
    ],
    [
      "a 3D vector with positions",
      steer(vector({ activations: tensor([1, 3, 8]), positionIndices: [0, 63, 7] })),
      small,
      one,
    ],
    [
      "a 3D vector without positions",
      steer(vector({ activations: tensor([2, 5, 8]), layerIndices: [0, 1] })),
      small,
      one,
    ],
    ["negative scale", steer(vector({ scale: -4 })), small, one],
    [
      "bf16 zstd",
      steer(
        vector({ activations: tensor([1, 8], { dtype: Dtype.BFLOAT16, compression: Compression.ZSTD }) }),
      ),
      small,
      one,
    ],
    ["f16 raw", steer(vector({ activations: tensor([1, 8], { dtype: Dtype.FLOAT16 }) })), small, one],
    [
      "f16 max 65504",
      steer(vector({ activations: withValue([1, 8], 3, 65504, { dtype: Dtype.FLOAT16 }) })),
      small,
      one,
    ],
    [
      "capture and steering together",
      request({
        outputResidualStream: { layerIndices: [1] },
        applySteeringVectors: [vector(), vector({ layerIndices: [1] })],
      }),
      small,
      one,
    ],
    // A fan-out: several prompts and n > 1 are allowed; the cap counts every choice.
    ["capture with 3 prompts × n = 2", capture([1]), small, { ...one, prompts: 3, n: 2 }],
    ["steering with 2 prompts × n = 3", steer(vector()), small, { ...one, prompts: 2, n: 3 }],
    [
      "capture cap exactly full over 6 choices",
      capture([0, 1]),
      llama,
      { prompts: 3, n: 2, promptTokens: 30, maxTokens: 672 },
    ],
  ];
  it.each(accepted)("%s", (_name, req, model, counts) => {
    expect(() => checkLensRequest(req, model, counts)).not.toThrow();
  });
});

describe("checkLensRequest refuses (400 invalid_request, exact param)", () => {
  const O = "output_residual_stream";
  const S = "apply_steering_vectors";
  const S0 = "apply_steering_vectors[0]";
  const refused: Array<
    [string, ReturnType<typeof request>, LensModelFacts, LensRequestCounts, string, string | RegExp]
  > = [
    // output_residual_stream
    [
      "all_layers and a list",
      capture([1], true),
      small,
      one,
      O,
      `Invalid value for '${O}': must be true or a non-empty list of layer indices.`,
    ],
    ["neither all_layers nor a list", capture([]), small, one, O, /must be true or a non-empty list/],
    [
      "layer = numLayers",
      capture([4]),
      small,
      one,
      O,
      `Invalid value for '${O}': layer index 4 is out of range: the model has 4 layers, 0 … 3.`,
    ],
    ["negative layer", capture([-1]), small, one, O, /layer index -1 is out of range/],
    [
      "duplicate layer",
      capture([1, 2, 1]),
      small,
      one,
      O,
      `Invalid value for '${O}': layer index 1 appears more than once.`,
    ],
    [
      "capture cap over the whole request: 3 prompts × n = 2",
      capture([0, 1]),
      llama,
      { prompts: 3, n: 2, promptTokens: 30, maxTokens: 673 },
      O,
      `Invalid value for '${O}': one request captures at most 2^25 numbers in all, so layers × Σ over its choices of (prompt tokens + max_tokens) must be at most 8192 for a hidden size of 4096, but 2 layers × (6 choices: 60 prompt tokens + 6 × 673 max_tokens) is 8196.`,
    ],
    [
      "capture cap: all 32 layers for 257 tokens",
      capture([], true),
      llama,
      { prompts: 1, n: 1, promptTokens: 57, maxTokens: 200 },
      O,
      `Invalid value for '${O}': one capture holds at most 2^25 numbers, so layers × (prompt tokens + max_tokens) must be at most 8192 for a hidden size of 4096, but 32 layers × (57 prompt tokens + 200 max_tokens) is 8224.`,
    ],
    [
      "capture cap: 1 layer for 8193 tokens",
      capture([0]),
      llama,
      { prompts: 1, n: 1, promptTokens: 1, maxTokens: 8192 },
      O,
      /but 1 layers × \(1 prompt tokens \+ 8192 max_tokens\) is 8193/,
    ],
    // apply_steering_vectors: request level
    // activations
    [
      "no activations",
      steer({ layerIndices: [1] }),
      small,
      one,
      `${S0}.activations`,
      `Missing required parameter: '${S0}.activations'.`,
    ],
    [
      "1D activations",
      steer(vector({ activations: tensor([8]) })),
      small,
      one,
      `${S0}.activations`,
      `Invalid value for '${S0}.activations': must be 2D (layers, hidden) or 3D (layers, positions, hidden), but its shape is [8].`,
    ],
    [
      "4D activations",
      steer(vector({ activations: hollow([1, 1, 1, 8]) })),
      small,
      one,
      `${S0}.activations`,
      /but its shape is \[1, 1, 1, 8\]/,
    ],
    [
      "an empty dimension",
      steer(vector({ activations: hollow([1, 0, 8]) })),
      small,
      one,
      `${S0}.activations`,
      /shape \[1, 0, 8\] has an empty dimension/,
    ],
    [
      "dim 0 ≠ len(layer_indices)",
      steer(vector({ activations: tensor([2, 8]), layerIndices: [1] })),
      small,
      one,
      `${S0}.activations`,
      `Invalid value for '${S0}.activations': dim 0 of shape [2, 8] is 2, but layer_indices lists 1 layer; they must be equal.`,
    ],
    [
      "last dim ≠ hidden size",
      steer(vector({ activations: tensor([1, 7]) })),
      small,
      one,
      `${S0}.activations`,
      `Invalid value for '${S0}.activations': the last dim of shape [1, 7] is 7, but the model's hidden size is 8.`,
    ],
    [
      "3D last dim ≠ hidden size",
      steer(vector({ activations: hollow([1, 2, 4096 * 2]) })),
      small,
      one,
      `${S0}.activations`,
      /is 8192, but the model's hidden size is 8/,
    ],
    [
      "dtype unspecified",
      steer(vector({ activations: { ...tensor([1, 8]), dtype: Dtype.UNSPECIFIED } })),
      small,
      one,
      `${S0}.activations`,
      /dtype 0 is not one of BFLOAT16, FLOAT16, FLOAT32/,
    ],
    [
      "unknown compression",
      steer(vector({ activations: { ...tensor([1, 8]), compression: 5 as Compression } })),
      small,
      one,
      `${S0}.activations`,
      /compression 5 is not one of/,
    ],
    [
      "bytes short of the shape",
      steer(vector({ activations: { ...tensor([1, 8]), data: new Uint8Array(30) } })),
      small,
      one,
      `${S0}.activations`,
      `Invalid value for '${S0}.activations': shape [1, 8] holds 8 numbers (32 bytes as float32) but data has 30 bytes.`,
    ],
    [
      "bad zstd",
      steer(vector({ activations: { ...tensor([1, 8]), compression: Compression.ZSTD } })),
      small,
      one,
      `${S0}.activations`,
      /but data is not a zstd frame/,
    ],
    [
      "NaN in f32",
      steer(vector({ activations: withValue([1, 8], 5, Number.NaN) })),
      small,
      one,
      `${S0}.activations`,
      `Invalid value for '${S0}.activations': every number must be finite, but element [0, 5] is NaN.`,
    ],
    [
      "+Inf in bf16",
      steer(
        vector({
          activations: withValue([1, 2, 8], 11, Number.POSITIVE_INFINITY, { dtype: Dtype.BFLOAT16 }),
        }),
      ),
      small,
      one,
      `${S0}.activations`,
      /element \[0, 1, 3\] is Infinity/,
    ],
    [
      "-Inf in f16 (overflow)",
      steer(vector({ activations: withValue([1, 8], 0, -1e6, { dtype: Dtype.FLOAT16 }) })),
      small,
      one,
      `${S0}.activations`,
      /element \[0, 0\] is -Infinity/,
    ],
    [
      "NaN in zstd bf16",
      steer(
        vector({
          activations: withValue([1, 8], 7, Number.NaN, {
            dtype: Dtype.BFLOAT16,
            compression: Compression.ZSTD,
          }),
        }),
      ),
      small,
      one,
      `${S0}.activations`,
      /element \[0, 7\] is NaN/,
    ],
    // layer_indices
    [
      "no layer_indices",
      steer(vector({ layerIndices: [] })),
      small,
      one,
      `${S0}.layer_indices`,
      `Invalid value for '${S0}.layer_indices': must list at least one layer index.`,
    ],
    [
      "layer out of range",
      steer(vector({ layerIndices: [4] })),
      small,
      one,
      `${S0}.layer_indices`,
      /layer index 4 is out of range: the model has 4 layers, 0 … 3/,
    ],
    [
      "negative layer index",
      steer(vector({ layerIndices: [-2] })),
      small,
      one,
      `${S0}.layer_indices`,
      /layer index -2 is out of range/,
    ],
    [
      "duplicate layer index",
      steer(vector({ activations: tensor([2, 8]), layerIndices: [3, 3] })),
      small,
      one,
      `${S0}.layer_indices`,
      /layer index 3 appears more than once/,
    ],
    // position_indices
    [
      "positions with 2D",
      steer(vector({ positionIndices: [0] })),
      small,
      one,
      `${S0}.position_indices`,
      `Invalid value for '${S0}.position_indices': is only for 3D activations (layers, positions, hidden), but the shape is [1, 8].`,
    ],
    [
      "positions length ≠ dim 1",
      steer(vector({ activations: tensor([1, 3, 8]), positionIndices: [0, 1] })),
      small,
      one,
      `${S0}.position_indices`,
      /has 2 entries, but dim 1 of activations shape \[1, 3, 8\] is 3/,
    ],
    [
      "position = max_model_len",
      steer(vector({ activations: tensor([1, 1, 8]), positionIndices: [64] })),
      small,
      one,
      `${S0}.position_indices`,
      `Invalid value for '${S0}.position_indices': position 64 is out of range: positions are 0 … 63 (max_model_len 64).`,
    ],
    [
      "negative position",
      steer(vector({ activations: tensor([1, 1, 8]), positionIndices: [-1] })),
      small,
      one,
      `${S0}.position_indices`,
      /position -1 is out of range/,
    ],
    // scale
    [
      "scale NaN",
      steer(vector({ scale: Number.NaN })),
      small,
      one,
      `${S0}.scale`,
      `Invalid value for '${S0}.scale': must be a finite number, not NaN.`,
    ],
    [
      "scale Infinity",
      steer(vector({ scale: Number.POSITIVE_INFINITY })),
      small,
      one,
      `${S0}.scale`,
      /not Infinity/,
    ],
    // the index in the param follows the vector
    [
      "second vector's layer",
      steer(vector(), vector({ layerIndices: [9] })),
      small,
      one,
      "apply_steering_vectors[1].layer_indices",
      /layer index 9/,
    ],
    [
      "third vector's NaN",
      steer(vector(), vector(), vector({ activations: withValue([1, 8], 0, Number.NaN) })),
      small,
      one,
      "apply_steering_vectors[2].activations",
      /element \[0, 0\] is NaN/,
    ],
    // caps, checked before any decoding (the hollow tensors have no bytes at all)
    [
      "one vector over 2^25 numbers",
      steer(vector({ activations: hollow([2, 2 ** 12 + 1, 4096]), layerIndices: [0, 1] })),
      llama,
      one,
      `${S0}.activations`,
      /holds more than 33554432 numbers/,
    ],
    [
      "all vectors over 2^23 numbers",
      steer(
        ...Array.from({ length: 65 }, () =>
          vector({ activations: hollow([32, 4096]), layerIndices: Array.from({ length: 32 }, (_, i) => i) }),
        ),
      ),
      llama,
      one,
      S,
      `Invalid value for '${S}': the steering vectors hold ${65 * 32 * 4096} numbers in all, more than the ${MAX_STEERING_NUMBERS} (2^23) one request may send.`,
    ],
  ];
  it.each(refused)("%s", (_name, req, model, counts, param, message) => {
    expectApiError(() => checkLensRequest(req, model, counts), {
      code: "invalid_request",
      status: 400,
      param,
      message,
    });
  });

  it("the steering cap lets 64 vectors over all 32 layers of llama-8b through", () => {
    const full = vector({
      activations: tensor([32, 4096]),
      layerIndices: Array.from({ length: 32 }, (_, i) => i),
    });
    expect(() => checkLensRequest(steer(...new Array(64).fill(full)), llama, one)).not.toThrow();
  });
});

describe("captureLayerTokenLimit", () => {
  it.each([
    [4096, 8192],
    [8192, 4096],
    [5120, 6553],
    [1, 2 ** 25],
  ])("hidden %i → %i layers × tokens", (hidden, limit) => {
    expect(captureLayerTokenLimit(hidden)).toBe(limit);
  });
});
