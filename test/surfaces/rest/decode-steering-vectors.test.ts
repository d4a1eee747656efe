import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Dtype, TensorSchema } from "../../../gen/acs/v1/lens_pb.js";
import { ApiError } from "../../../src/core/errors/index.js";
import { decodeCompletionRequest } from "../../../src/surfaces/rest/decode-completion-request.js";

// The decoder with the real lens codec (src/lens): the tensor forms of proto/API.md §6 arrive as
// acs.v1.Tensor, and the codec's refusals name the steering vector's param path.

const f32 = (...values: number[]) => new Uint8Array(new Float32Array(values).buffer);

describe("apply_steering_vectors[i].activations through the lens codec", () => {
  it.each([
    {
      name: "nested arrays (2D) → float32",
      activations: [
        [0.5, 1],
        [2, -1],
      ],
      tensor: { dtype: Dtype.FLOAT32, shape: [2, 2], data: f32(0.5, 1, 2, -1) },
    },
    {
      name: "the vllm-lens dict",
      activations: {
        data: Buffer.from(f32(0, 1)).toString("base64"),
        dtype: "float32",
        shape: [1, 2],
        compression: null,
      },
      tensor: { dtype: Dtype.FLOAT32, shape: [1, 2], data: f32(0, 1) },
    },
  ])("$name", ({ activations, tensor }) => {
    const { request } = decodeCompletionRequest(
      JSON.stringify({ apply_steering_vectors: [{ activations, layer_indices: [0] }] }),
    );
    const [vector] = request.applySteeringVectors;
    const expected = create(TensorSchema, tensor);
    expect({ ...vector?.activations, data: [...(vector?.activations?.data ?? [])] }).toEqual({
      ...expected,
      data: [...expected.data],
    });
    expect(vector?.layerIndices).toEqual([0]);
  });

  it.each([
    // A wrong type names the element itself (proto/API.md §4: param = the field's path).
    { activations: '[[0.5, "x"]]', at: "[0][1]" },
    { activations: "[[1e400]]", at: "" },
    { activations: '{"data": "AAAA", "dtype": "float64", "shape": [1]}', at: "" },
    { activations: '{"data": "AAAA", "dtype": 5, "shape": [1]}', at: ".dtype" },
    { activations: "3", at: "" },
  ])("refuses $activations naming its param path", ({ activations, at }) => {
    const param = `apply_steering_vectors[1].activations${at}`;
    let caught: unknown;
    try {
      decodeCompletionRequest(`{"apply_steering_vectors": [{}, {"activations": ${activations}}]}`);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(ApiError);
    const err = caught as ApiError;
    expect([err.status, err.code, err.param]).toEqual([400, "invalid_request", param]);
    expect(
      err.message.startsWith(
        `Invalid ${at === "" && activations !== "3" ? "value" : "type"} for '${param}': `,
      ),
    ).toBe(true);
  });
});
