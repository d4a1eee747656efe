// protovalidate violations → the API's param and message, for requests from either surface.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import { validateRequest } from "../../src/service/index.js";

type Init = MessageInitShape<typeof CreateCompletionRequestSchema>;
const text = { case: "text" as const, value: "x" };
const tensor = { dtype: 3, shape: [1, 4], data: new Uint8Array(16) };

const cases: Array<[string, Init, string | null, string]> = [
  ["missing model", { prompt: text }, "model", "You must provide a model parameter."],
  ["missing prompt", { model: "m" }, "prompt", "You must provide a prompt."],
  [
    "empty prompt",
    { model: "m", prompt: { case: "text", value: "" } },
    "prompt",
    "Invalid value for 'prompt': must not be empty.",
  ],
  [
    "empty prompt list",
    { model: "m", prompt: { case: "texts", value: { values: [] } } },
    "prompt",
    "Invalid value for 'prompt': must not be empty.",
  ],
  [
    "negative token id",
    { model: "m", prompt: { case: "tokenIdsList", value: { values: [{ values: [1, -2] }] } } },
    "prompt",
    "Invalid value for 'prompt': must be greater than or equal to 0.",
  ],
  [
    "max_tokens 0",
    { model: "m", prompt: text, maxTokens: 0 },
    "max_tokens",
    "Invalid value for 'max_tokens': must be greater than or equal to 1.",
  ],
  [
    "n greedy",
    { model: "m", prompt: text, n: 3, temperature: 0 },
    "n",
    "Invalid value for 'n': n above 1 needs a temperature of at least 0.00001.",
  ],
  [
    "min_tokens above max_tokens",
    { model: "m", prompt: text, minTokens: 9, maxTokens: 3 },
    "min_tokens",
    "Invalid value for 'min_tokens': min_tokens must be at most max_tokens.",
  ],
  [
    "five stops",
    { model: "m", prompt: text, stop: ["a", "b", "c", "d", "e"] },
    "stop",
    "Invalid value for 'stop': must contain no more than 4 items.",
  ],
  [
    "long user",
    { model: "m", prompt: text, user: "u".repeat(257) },
    "user",
    "Invalid value for 'user': must be at most 256 characters.",
  ],
  [
    "empty capture",
    { model: "m", prompt: text, outputResidualStream: {} },
    "output_residual_stream",
    "Invalid value for 'output_residual_stream': must be true or a non-empty list of layer indices.",
  ],
  [
    "duplicate capture layer",
    { model: "m", prompt: text, outputResidualStream: { layerIndices: [1, 1] } },
    "output_residual_stream",
    "Invalid value for 'output_residual_stream': repeated value must contain unique items.",
  ],
  [
    "steering without activations",
    {
      model: "m",
      prompt: text,
      applySteeringVectors: [{ activations: tensor, layerIndices: [0] }, { layerIndices: [0] }],
    },
    "apply_steering_vectors[1].activations",
    "Invalid value for 'apply_steering_vectors[1].activations': value is required.",
  ],
  [
    "steering duplicate layers",
    { model: "m", prompt: text, applySteeringVectors: [{ activations: tensor, layerIndices: [2, 2] }] },
    "apply_steering_vectors[0].layer_indices",
    "Invalid value for 'apply_steering_vectors[0].layer_indices': repeated value must contain unique items.",
  ],
  [
    "steering scale not finite",
    {
      model: "m",
      prompt: text,
      applySteeringVectors: [{ activations: tensor, layerIndices: [0], scale: Number.NaN }],
    },
    "apply_steering_vectors[0].scale",
    "Invalid value for 'apply_steering_vectors[0].scale': must be finite.",
  ],
];

describe("validateRequest", () => {
  it.each(cases)("%s", (_name, init, param, message) => {
    let caught: unknown;
    try {
      validateRequest(create(CreateCompletionRequestSchema, init));
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(ApiError);
    expect({
      code: (caught as ApiError).code,
      param: (caught as ApiError).param,
      message: (caught as ApiError).message,
    }).toEqual({
      code: "invalid_request",
      param,
      message,
    });
  });

  it("accepts a request with every field in range", () => {
    expect(() =>
      validateRequest(
        create(CreateCompletionRequestSchema, {
          model: "m",
          prompt: { case: "tokenIds", value: { values: [1, 2] } },
          maxTokens: 5,
          n: 2,
          temperature: 0.7,
          topP: 1,
          stop: ["a"],
          logprobs: 20,
          seed: -(2n ** 63n),
          topK: -1,
          minP: 1,
          repetitionPenalty: 2,
          minTokens: 5,
          promptLogprobs: 0,
          priority: -5,
          outputResidualStream: { allLayers: true },
        }),
      ),
    ).not.toThrow();
  });
});
