/**
 * vllm-lens behaviours: capture (shape, layers ascending, values = the engine's own forward pass
 * rounded to bf16, decoded by independent decoders too: see test/helpers/decode-tensor.ts),
 * steering through the HTTP API, and the documented quirks (first prompt only, n > 1 skipped,
 * wrong hidden size skipped + capture dropped).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  decodeTensorDict,
  encodeFloatTensorAsBf16,
  type RunningEngine,
  roundBf16,
  startEngine,
} from "../../src/engine/index.js";
import { independentDecoders, type TensorDict } from "../helpers/decode-tensor.js";
import { postJson, postSse } from "./helpers.js";

let engine: RunningEngine;
let url: string;
beforeAll(async () => {
  engine = await startEngine({ preset: "tiny" });
  url = `${engine.url}/v1/completions`;
});
afterAll(async () => {
  await engine.close();
});

const D = 64;
const base = {
  model: "acs/tiny",
  prompt: "The rabbit",
  max_tokens: 6,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
};
type Tensor = Record<string, unknown>;
interface Resp {
  choices: { text: string; token_ids: number[]; prompt_token_ids: number[] }[];
  activations?: { residual_stream: Tensor };
}

const vector = (seed: number) => Array.from({ length: D }, (_, i) => Math.cos(i * 0.7 + seed) * 4);

async function complete(body: Record<string, unknown>): Promise<Resp> {
  const r = await postJson(url, body);
  expect(r.status, JSON.stringify(r.json)).toBe(200);
  return r.json as unknown as Resp;
}

describe("output_residual_stream", () => {
  it("returns (layers ascending, n_prompt + n_gen − 1, hidden) bf16 equal to the engine's forward pass", async () => {
    const r = await complete({ ...base, vllm_xargs: { output_residual_stream: "[3, 1]" } });
    const t = r.activations!.residual_stream;
    expect(t).toMatchObject({ dtype: "int16", original_dtype: "torch.bfloat16", compression: "zstd" });
    const c = r.choices[0]!;
    const positions = c.prompt_token_ids.length + c.token_ids.length - 1;
    expect(t.shape).toEqual([2, positions, D]);
    const decoded = await decodeTensorDict(t, 1 << 24);
    const ref = await engine.model.forward([...c.prompt_token_ids, ...c.token_ids].slice(0, positions));
    [1, 3].forEach((layer, li) => {
      const want = Array.from(ref.residualStream[layer]!, roundBf16);
      expect(Array.from(decoded.data.subarray(li * positions * D, (li + 1) * positions * D))).toEqual(want);
    });
  });

  it("any non-list value captures all layers; only non-streamed completions carry activations", async () => {
    const r = await complete({ ...base, vllm_xargs: { output_residual_stream: "false" } });
    expect((r.activations!.residual_stream.shape as number[])[0]).toBe(4);
    const s = await postSse(url, { ...base, stream: true, vllm_xargs: { output_residual_stream: "[0]" } });
    expect(s.events.some((e) => e.json && "activations" in e.json)).toBe(false);
  });

  it("only the first prompt's activations are returned; n > 1 silently skips capture", async () => {
    const r = await complete({
      ...base,
      prompt: ["ab", "cdefg"],
      vllm_xargs: { output_residual_stream: "[0]" },
    });
    const c = r.choices[0]!;
    expect(r.activations!.residual_stream.shape).toEqual([
      1,
      c.prompt_token_ids.length + c.token_ids.length - 1,
      D,
    ]);
    const n2 = await complete({
      ...base,
      n: 2,
      temperature: 1,
      vllm_xargs: { output_residual_stream: "[0]" },
    });
    expect(n2.activations).toBeUndefined();
  });

  it.each(independentDecoders().map((d) => [d.name, d] as const))(
    "an independent decoder (%s) reads the same numbers",
    async (_name, decoder) => {
      const r = await complete({ ...base, vllm_xargs: { output_residual_stream: "[2]" } });
      const t = r.activations!.residual_stream;
      const [theirs] = decoder.decode([t as unknown as TensorDict]);
      const ours = await decodeTensorDict(t, 1 << 24);
      expect(theirs!.shape).toEqual(ours.shape);
      expect(Array.from(theirs!.values)).toEqual(Array.from(ours.data));
    },
  );
});

describe("apply_steering_vectors", () => {
  it("steering changes the text; capture reflects the engine's steered forward pass", async () => {
    const plain = await complete({ ...base, max_tokens: 12 });
    const steering = [{ activations: [vector(1)], layer_indices: [1], scale: 3 }];
    const r = await complete({
      ...base,
      max_tokens: 12,
      vllm_xargs: { apply_steering_vectors: JSON.stringify(steering), output_residual_stream: "[1]" },
    });
    expect(r.choices[0]!.token_ids).not.toEqual(plain.choices[0]!.token_ids);
    const c = r.choices[0]!;
    const ids = [...c.prompt_token_ids, ...c.token_ids].slice(0, -1);
    const ref = await engine.model.forward(ids, { steering: JSON.stringify(steering) });
    const got = await decodeTensorDict(r.activations!.residual_stream, 1 << 24);
    expect(Array.from(got.data)).toEqual(Array.from(ref.residualStream[1]!, roundBf16));
  });

  it("scale 0 reproduces the unsteered output; a raw bf16 tensor dict (no compression) works", async () => {
    const plain = await complete({ ...base, max_tokens: 12 });
    const zero = await complete({
      ...base,
      max_tokens: 12,
      vllm_xargs: {
        apply_steering_vectors: JSON.stringify([{ activations: [vector(2)], layer_indices: [2], scale: 0 }]),
      },
    });
    expect(zero.choices[0]!.token_ids).toEqual(plain.choices[0]!.token_ids);
    const dict = encodeFloatTensorAsBf16(Float32Array.from(vector(3)), [1, D]);
    const raw = {
      ...dict,
      data: Buffer.from(await zstdRaw(dict)).toString("base64"),
      compression: undefined,
    };
    const viaDict = await complete({
      ...base,
      max_tokens: 12,
      vllm_xargs: { apply_steering_vectors: JSON.stringify([{ activations: raw, layer_indices: [0] }]) },
    });
    const viaArray = await complete({
      ...base,
      max_tokens: 12,
      vllm_xargs: {
        apply_steering_vectors: JSON.stringify([
          { activations: [vector(3).map(roundBf16)], layer_indices: [0] },
        ]),
      },
    });
    expect(viaDict.choices[0]!.token_ids).toEqual(viaArray.choices[0]!.token_ids);
  });

  it("vllm-lens's 400s: dims and shape[0] == len(layer_indices)", async () => {
    for (const sv of [
      [{ activations: vector(1), layer_indices: [0] }],
      [{ activations: [vector(1), vector(2)], layer_indices: [0] }],
    ]) {
      const r = await postJson(url, { ...base, vllm_xargs: { apply_steering_vectors: JSON.stringify(sv) } });
      expect(r.status).toBe(400);
      expect(r.json.error).toMatchObject({ type: "BadRequestError", code: 400 });
    }
  });

  it("wrong hidden size: steering silently skipped and the capture dropped", async () => {
    const plain = await complete({ ...base, max_tokens: 12 });
    const r = await complete({
      ...base,
      max_tokens: 12,
      vllm_xargs: {
        apply_steering_vectors: JSON.stringify([
          { activations: [[1, 2, 3]], layer_indices: [1], scale: 100 },
        ]),
        output_residual_stream: "[1, 2]",
      },
    });
    expect(r.choices[0]!.token_ids).toEqual(plain.choices[0]!.token_ids);
    expect(r.activations).toBeUndefined();
  });

  it("n > 1: steering silently skipped", async () => {
    const body = { ...base, n: 2, temperature: 1, seed: 9, max_tokens: 10 };
    const plain = await complete(body);
    const steered = await complete({
      ...body,
      vllm_xargs: {
        apply_steering_vectors: JSON.stringify([{ activations: [vector(5)], layer_indices: [0], scale: 50 }]),
      },
    });
    expect(steered.choices.map((c) => c.token_ids)).toEqual(plain.choices.map((c) => c.token_ids));
  });
});

async function zstdRaw(dict: { data: string }): Promise<Uint8Array> {
  const { zstdDecompressCapped } = await import("../../src/engine/tensor-codec.js");
  return zstdDecompressCapped(Buffer.from(dict.data, "base64"), 1 << 24);
}
