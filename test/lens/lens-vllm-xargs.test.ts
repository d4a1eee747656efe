import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { Compression, Dtype } from "../../gen/acs/v1/lens_pb.js";
import { isJsonText, type JsonText, jsonTextToString } from "../../src/core/json-text/index.js";
import {
  decodeTensor,
  encodeTensor,
  type LensModelFacts,
  lensVllmXargs,
  parseTensorJson,
  rawBytesToFloat32,
} from "../../src/lens/index.js";
import { expectApiError } from "./api-error-expect.js";

const model: LensModelFacts = { hiddenSize: 4, numLayers: 6, maxModelLen: 128 };
const request = (init: MessageInitShape<typeof CreateCompletionRequestSchema> = {}) =>
  create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "text", value: "hi" }, ...init });

describe("lensVllmXargs: output_residual_stream", () => {
  const cases: Array<[string, { allLayers?: boolean; layerIndices?: number[] }, string]> = [
    ["a sorted list", { layerIndices: [0, 5] }, "[0, 5]"],
    ["sorts the list", { layerIndices: [5, 0, 3] }, "[0, 3, 5]"],
    ["one layer", { layerIndices: [2] }, "[2]"],
    ["all layers as the explicit list", { allLayers: true }, "[0, 1, 2, 3, 4, 5]"],
  ];
  it.each(cases)("%s", (_name, outputResidualStream, expected) => {
    const xargs = lensVllmXargs(request({ outputResidualStream }), model);
    expect(xargs).toEqual({ output_residual_stream: expected });
    expect(Array.isArray(JSON.parse(xargs.output_residual_stream as string))).toBe(true);
  });

  it("a request without lens fields gives no entries", () => {
    expect(lensVllmXargs(request({ temperature: 0 }), model)).toEqual({});
  });
});

describe("lensVllmXargs: apply_steering_vectors", () => {
  const values = [1, -2, 0.1, 3.5, 2 ** -20, -0, 65504, 7];

  function decodeWire(xargs: Record<string, string | JsonText>) {
    const text = xargs.apply_steering_vectors;
    if (!isJsonText(text)) throw new Error("apply_steering_vectors is not a JsonText");
    return JSON.parse(jsonTextToString(text)) as Array<Record<string, unknown>>;
  }

  it("sends every default explicitly and activations as raw float32 {data, dtype, shape}", () => {
    const activations = encodeTensor(values, [2, 4], {
      dtype: Dtype.BFLOAT16,
      compression: Compression.ZSTD,
    });
    const wire = decodeWire(
      lensVllmXargs(request({ applySteeringVectors: [{ activations, layerIndices: [4, 1] }] }), model),
    );
    expect(wire).toHaveLength(1);
    const entry = wire[0]!;
    expect(Object.keys(entry)).toEqual([
      "activations",
      "layer_indices",
      "scale",
      "norm_match",
      "position_indices",
    ]);
    expect(entry).toMatchObject({
      layer_indices: [4, 1],
      scale: 1,
      norm_match: false,
      position_indices: null,
    });
    const dict = entry.activations as Record<string, unknown>;
    expect(Object.keys(dict).sort()).toEqual(["data", "dtype", "shape"]);
    expect(dict).toMatchObject({ dtype: "float32", shape: [2, 4] });
    // the float32 values are exactly the bf16 values the caller sent
    const sent = Buffer.from(dict.data as string, "base64");
    expect(sent.length).toBe(8 * 4);
    expect(Array.from(new Float32Array(sent.buffer, sent.byteOffset, 8))).toEqual(
      Array.from(decodeTensor(activations)),
    );
    // and our own REST decoder reads the wire dict back (it is a valid legacy vllm-lens dict)
    expect(Array.from(decodeTensor(parseTensorJson(dict, "x")))).toEqual(
      Array.from(decodeTensor(activations)),
    );
  });

  it("keeps given values: scale, norm_match, 3D position_indices; f32 raw bytes pass unchanged", () => {
    const a = encodeTensor(values, [1, 2, 4]);
    const b = encodeTensor(values.slice(0, 4), [1, 4], { dtype: Dtype.FLOAT16 });
    const wire = decodeWire(
      lensVllmXargs(
        request({
          applySteeringVectors: [
            { activations: a, layerIndices: [0], scale: -2.5, normMatch: true, positionIndices: [7, 3] },
            { activations: b, layerIndices: [5], scale: 0 },
          ],
        }),
        model,
      ),
    );
    expect(wire.map(({ activations: _a, ...rest }) => rest)).toEqual([
      { layer_indices: [0], scale: -2.5, norm_match: true, position_indices: [7, 3] },
      { layer_indices: [5], scale: 0, norm_match: false, position_indices: null },
    ]);
    expect((wire[0]!.activations as { data: string }).data).toBe(Buffer.from(a.data).toString("base64"));
    expect((wire[1]!.activations as { shape: number[] }).shape).toEqual([1, 4]);
  });

  it("keeps the tensor as raw bytes (no base64 text made) until the body is written", () => {
    const activations = encodeTensor(values, [2, 4], { dtype: Dtype.FLOAT16, compression: Compression.ZSTD });
    const decoded = [new Uint8Array(16).fill(0x3c)]; // as checkLensShapes returned them: 8 × f16 1.0
    const text = lensVllmXargs(
      request({ applySteeringVectors: [{ activations, layerIndices: [0, 1] }] }),
      model,
      decoded,
    ).apply_steering_vectors;
    if (!isJsonText(text)) throw new Error("not a JsonText");
    const sources = text.parts.filter((p) => typeof p !== "string");
    expect(sources).toHaveLength(1);
    expect(sources[0]!.byteLength).toBe(8 * 4); // float32, widened as it is written
    expect(text.parts.filter((p) => typeof p === "string").join("").length).toBeLessThan(200);
    // the decoded bytes given are the ones sent (not decoded again from the request)
    const wire = JSON.parse(jsonTextToString(text)) as Array<{ activations: { data: string } }>;
    const sent = Buffer.from(wire[0]!.activations.data, "base64");
    expect(Array.from(new Float32Array(sent.buffer, sent.byteOffset, 8))).toEqual(
      Array.from(rawBytesToFloat32(decoded[0]!, Dtype.FLOAT16)),
    );
    expect(sent.readFloatLE(0)).toBe(1.05859375); // f16 0x3c3c
  });

  it.each([
    ["bf16", Dtype.BFLOAT16],
    ["f16", Dtype.FLOAT16],
    ["f32", Dtype.FLOAT32],
  ] as const)("widens a %s tensor of many pieces exactly (30,001 numbers)", (_name, dtype) => {
    const many = Float32Array.from({ length: 30_001 }, (_, i) => Math.sin(i) * 100);
    const activations = encodeTensor(many, [1, 30_001], { dtype });
    const wire = decodeWire(
      lensVllmXargs(request({ applySteeringVectors: [{ activations, layerIndices: [2] }] }), model),
    );
    const sent = Buffer.from((wire[0]!.activations as { data: string }).data, "base64");
    expect(sent.length).toBe(30_001 * 4);
    expect(new Float32Array(sent.buffer.slice(sent.byteOffset, sent.byteOffset + sent.length))).toEqual(
      decodeTensor(activations),
    );
  });

  it("together with a capture", () => {
    const xargs = lensVllmXargs(
      request({
        outputResidualStream: { layerIndices: [3] },
        applySteeringVectors: [{ activations: encodeTensor([1, 2, 3, 4], [1, 4]), layerIndices: [3] }],
      }),
      model,
    );
    expect(Object.keys(xargs).sort()).toEqual(["apply_steering_vectors", "output_residual_stream"]);
  });

  it("refuses bytes that do not match the shape (400, param of the vector)", () => {
    const broken = { ...encodeTensor([1, 2, 3, 4], [1, 4]), shape: [1, 5] };
    expectApiError(
      () =>
        lensVllmXargs(request({ applySteeringVectors: [{ activations: broken, layerIndices: [0] }] }), model),
      {
        code: "invalid_request",
        param: "apply_steering_vectors[0].activations",
        message: /holds 5 numbers \(20 bytes as float32\) but data has 16 bytes/,
      },
    );
  });
});
