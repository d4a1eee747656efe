// Malformed capture and steering requests over REST (vllm-lens dicts) and Connect (acs.v1.Tensor):
// the same status, type, code, param and message; Inference never sees them.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { Compression, Dtype, type TensorSchema } from "../../gen/acs/v1/lens_pb.js";
import { zstdCompress } from "../../src/lens/index.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { rleZstdFrame } from "../lens/zstd-frames.js";

let stack: Stack;
let client: ReturnType<typeof createClient<typeof CompletionsService>>;
beforeAll(async () => {
  stack = await startStack();
  client = createClient(
    CompletionsService,
    createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
  );
});
afterAll(async () => {
  await stack.close();
});

/** Completion requests that reached Inference at all (refused there or not). */
function receivedByInference(): number {
  if (stack.engine === undefined) throw new Error("this test needs the reference engine");
  return stack.engine.stats.received;
}

const hidden = 64; // tiny preset
const layers = 4;

/** One tensor in both forms: Connect's Tensor and REST's vllm-lens dict. */
function tensor(shape: number[], data: Uint8Array, opts: { dtype?: Dtype; zstd?: boolean } = {}) {
  const dtype = opts.dtype ?? Dtype.FLOAT32;
  const names = {
    [Dtype.FLOAT32]: "float32",
    [Dtype.FLOAT16]: "float16",
    [Dtype.BFLOAT16]: "int16",
  } as Record<number, string>;
  return {
    connect: {
      dtype,
      shape,
      data,
      compression: opts.zstd ? Compression.ZSTD : Compression.UNSPECIFIED,
    } as MessageInitShape<typeof TensorSchema>,
    rest: {
      data: Buffer.from(data).toString("base64"),
      dtype: names[dtype],
      ...(dtype === Dtype.BFLOAT16 ? { original_dtype: "torch.bfloat16" } : {}),
      shape,
      compression: opts.zstd ? "zstd" : null,
    },
  };
}

function f32(values: number[]): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

const row = (fill = 0.5) => Array.from({ length: hidden }, () => fill);
const nanRow = f32([...row().slice(1), Number.NaN]);
const infBf16 = new Uint8Array(
  new Uint16Array(Array.from({ length: hidden }, (_, i) => (i === 3 ? 0x7f80 : 0x3f00))).buffer,
);

interface Case {
  name: string;
  vector?: {
    activations: ReturnType<typeof tensor>;
    layer_indices: number[];
    position_indices?: number[];
    scale?: number;
  };
  capture?: number[] | true;
  extra?: Record<string, unknown>;
  param: string;
}

const cases: Case[] = [
  {
    name: "NaN in float32",
    vector: { activations: tensor([1, hidden], nanRow), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "+Inf in bfloat16",
    vector: { activations: tensor([1, hidden], infBf16, { dtype: Dtype.BFLOAT16 }), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "zstd bomb",
    vector: { activations: tensor([1, hidden], rleZstdFrame(8192), { zstd: true }), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "not a zstd frame",
    vector: { activations: tensor([1, hidden], f32(row()), { zstd: true }), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "zstd of the wrong size",
    vector: {
      activations: tensor([1, hidden], zstdCompress(f32(row().slice(1))), { zstd: true }),
      layer_indices: [1],
    },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "bytes short of the shape",
    vector: { activations: tensor([1, hidden], f32(row().slice(1))), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "1-D",
    vector: { activations: tensor([hidden], f32(row())), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "4-D",
    vector: { activations: tensor([1, 1, 1, hidden], f32(row())), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "dim 0 ≠ len(layer_indices)",
    vector: { activations: tensor([2, hidden], f32([...row(), ...row()])), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "wrong hidden size",
    vector: { activations: tensor([1, hidden / 2], f32(row().slice(hidden / 2))), layer_indices: [1] },
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "layer out of range",
    vector: { activations: tensor([1, hidden], f32(row())), layer_indices: [layers] },
    param: "apply_steering_vectors[0].layer_indices",
  },
  {
    name: "duplicate layers",
    vector: { activations: tensor([2, hidden], f32([...row(), ...row()])), layer_indices: [1, 1] },
    param: "apply_steering_vectors[0].layer_indices",
  },
  {
    name: "position_indices on 2-D",
    vector: { activations: tensor([1, hidden], f32(row())), layer_indices: [1], position_indices: [0] },
    param: "apply_steering_vectors[0].position_indices",
  },
  {
    name: "position out of range",
    vector: { activations: tensor([1, 1, hidden], f32(row())), layer_indices: [1], position_indices: [512] },
    param: "apply_steering_vectors[0].position_indices",
  },
  {
    name: "positions ≠ dim 1",
    vector: {
      activations: tensor([1, 2, hidden], f32([...row(), ...row()])),
      layer_indices: [1],
      position_indices: [0],
    },
    param: "apply_steering_vectors[0].position_indices",
  },
  {
    name: "steering with 2 prompts (a fan-out): NaN",
    vector: { activations: tensor([1, hidden], nanRow), layer_indices: [1] },
    extra: { prompts: 2 },
    param: "apply_steering_vectors[0].activations",
  },
  { name: "capture layer out of range", capture: [layers], param: "output_residual_stream" },
];

function restBody(c: Case): Record<string, unknown> {
  const prompts = c.extra?.prompts === 2;
  return {
    model: "tiny",
    prompt: prompts ? ["Hi", "Ho"] : "Hi",
    max_tokens: (c.extra?.max_tokens as number | undefined) ?? 2,
    ...(c.capture !== undefined ? { output_residual_stream: c.capture } : {}),
    ...(c.vector
      ? {
          apply_steering_vectors: [
            {
              activations: c.vector.activations.rest,
              layer_indices: c.vector.layer_indices,
              ...(c.vector.position_indices ? { position_indices: c.vector.position_indices } : {}),
            },
          ],
        }
      : {}),
  };
}

function connectRequest(c: Case) {
  const prompts = c.extra?.prompts === 2;
  return create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: prompts ? { case: "texts", value: { values: ["Hi", "Ho"] } } : { case: "text", value: "Hi" },
    maxTokens: (c.extra?.max_tokens as number | undefined) ?? 2,
    ...(c.capture !== undefined
      ? { outputResidualStream: c.capture === true ? { allLayers: true } : { layerIndices: c.capture } }
      : {}),
    ...(c.vector
      ? {
          applySteeringVectors: [
            {
              activations: c.vector.activations.connect,
              layerIndices: c.vector.layer_indices,
              positionIndices: c.vector.position_indices ?? [],
            },
          ],
        }
      : {}),
  });
}

describe("lens refusals: REST and Connect agree; Inference never sees them", () => {
  it.each(cases)("$name", async (c) => {
    const before = receivedByInference();
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(restBody(c)),
    });
    expect(res.status).toBe(400);
    const rest = (await res.json()) as {
      error: { message: string; type: string; param: string; code: string };
    };
    expect(rest.error.param).toBe(c.param);
    expect(rest.error.code).toBe("invalid_request");

    const err = await client.createCompletion(connectRequest(c)).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0]?.error;
    expect({
      message: envelope?.message,
      type: envelope?.type,
      param: envelope?.param,
      code: envelope?.code,
    }).toEqual(rest.error);
    expect(receivedByInference()).toBe(before);
  });
});

describe("the capture cap on llama-8b (hidden 4096: layers × tokens ≤ 8,192)", () => {
  let big: Stack;
  beforeAll(async () => {
    big = await startStack({ preset: "llama-8b" });
  });
  afterAll(async () => {
    await big.close();
  });

  it("all 32 layers with 4 prompt tokens + 253 max_tokens is refused alike on REST and Connect", async () => {
    const res = await fetch(`${big.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "llama-8b",
        prompt: "The sky is",
        max_tokens: 253,
        output_residual_stream: true,
      }),
    });
    expect(res.status).toBe(400);
    const rest = (await res.json()) as { error: Record<string, unknown> };
    expect(rest.error).toEqual({
      message:
        "Invalid value for 'output_residual_stream': one capture holds at most 2^25 numbers, so layers × (prompt tokens + max_tokens) must be at most 8192 for a hidden size of 4096, but 32 layers × (4 prompt tokens + 253 max_tokens) is 8224.",
      type: "invalid_request_error",
      param: "output_residual_stream",
      code: "invalid_request",
    });
    const bigClient = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: big.url, httpVersion: "1.1" }),
    );
    const err = await bigClient
      .createCompletion(
        create(CreateCompletionRequestSchema, {
          model: "llama-8b",
          prompt: { case: "text", value: "The sky is" },
          maxTokens: 253,
          outputResidualStream: { allLayers: true },
        }),
      )
      .then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0]?.error;
    expect({
      message: envelope?.message,
      type: envelope?.type,
      param: envelope?.param,
      code: envelope?.code,
    }).toEqual(rest.error);
  });

  it("a fan-out (3 prompts × n = 2) is capped over all its choices, alike on REST and Connect", async () => {
    const before = big.engine?.stats.received;
    const prompts = ["The sky is", "The sea is", "The sun is"];
    const res = await fetch(`${big.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "llama-8b",
        prompt: prompts,
        n: 2,
        max_tokens: 679,
        output_residual_stream: [3, 7],
      }),
    });
    expect(res.status).toBe(400);
    const rest = (await res.json()) as { error: Record<string, unknown> };
    // Each prompt is 4 tokens (BOS + 3): 2 layers × (2 × 12 + 6 × 679) = 8196 > 8192, though each
    // choice alone (2 × 683 = 1366) is far below the cap.
    expect(rest.error).toEqual({
      message:
        "Invalid value for 'output_residual_stream': one request captures at most 2^25 numbers in all, so layers × Σ over its choices of (prompt tokens + max_tokens) must be at most 8192 for a hidden size of 4096, but 2 layers × (6 choices: 24 prompt tokens + 6 × 679 max_tokens) is 8196.",
      type: "invalid_request_error",
      param: "output_residual_stream",
      code: "invalid_request",
    });
    const bigClient = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: big.url, httpVersion: "1.1" }),
    );
    const err = await bigClient
      .createCompletion(
        create(CreateCompletionRequestSchema, {
          model: "llama-8b",
          prompt: { case: "texts", value: { values: prompts } },
          n: 2,
          maxTokens: 679,
          outputResidualStream: { layerIndices: [3, 7] },
        }),
      )
      .then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0]?.error;
    expect({
      message: envelope?.message,
      type: envelope?.type,
      param: envelope?.param,
      code: envelope?.code,
    }).toEqual(rest.error);
    expect(big.engine?.stats.received).toBe(before);
  });
});
