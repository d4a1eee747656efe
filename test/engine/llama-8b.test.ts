/** The llama-8b preset: Llama 3 shapes as callers see them, a full-context answer, and steering that shows. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { decodeTensorDict, type RunningEngine, startEngine } from "../../src/engine/index.js";
import { postJson } from "./helpers.js";

let engine: RunningEngine;
let url: string;
beforeAll(async () => {
  engine = await startEngine({ preset: "llama-8b" });
  url = `${engine.url}/v1/completions`;
});
afterAll(async () => {
  await engine.close();
});

interface Resp {
  choices: { text: string; token_ids: number[]; prompt_token_ids: number[]; finish_reason: string }[];
  usage: { prompt_tokens: number; completion_tokens: number };
  activations?: { residual_stream: Record<string, unknown> };
}

describe("llama-8b preset", () => {
  it("has Llama-3.1-8B's shape and tokenizer", async () => {
    expect(engine.model).toMatchObject({
      id: "meta-llama/Llama-3.1-8B",
      hiddenSize: 4096,
      numLayers: 32,
      vocabSize: 128256,
    });
    const t = await postJson(`${engine.url}/tokenize`, { model: engine.model.id, prompt: "Hello world" });
    expect(t.json.tokens).toEqual([128000, 9906, 1917]);
  });

  it("answers a greedy request of max_model_len − prompt tokens (ignore_eos) in full", async () => {
    // How fast (the 5-second rule) is measured by `npm run bench -- engine`, not asserted here.
    const prompt = "Four score and seven";
    const promptTokens = engine.model.tokenize(prompt).length;
    const r = await postJson(url, {
      model: engine.model.id,
      prompt,
      max_tokens: engine.model.maxModelLen - promptTokens,
      temperature: 0,
      ignore_eos: true,
    });
    expect(r.status).toBe(200);
    const body = r.json as unknown as Resp;
    expect(body.usage).toMatchObject({
      prompt_tokens: promptTokens,
      completion_tokens: engine.model.maxModelLen - promptTokens,
    });
    expect(body.choices[0]!.finish_reason).toBe("length");
  });

  it("steering at hidden 4096 visibly changes the text; capture has shape (layers, positions, 4096)", async () => {
    const body = {
      model: engine.model.id,
      prompt: "Alice was beginning to",
      max_tokens: 12,
      temperature: 0,
      ignore_eos: true,
      return_token_ids: true,
    };
    const plain = (await postJson(url, body)).json as unknown as Resp;
    const v = Array.from({ length: 4096 }, (_, i) => Math.sin(i * 0.37) * 3);
    const steered = (
      await postJson(url, {
        ...body,
        vllm_xargs: {
          apply_steering_vectors: JSON.stringify([{ activations: [v], layer_indices: [15], scale: 4 }]),
          output_residual_stream: "[15, 20]",
        },
      })
    ).json as unknown as Resp;
    expect(steered.choices[0]!.text).not.toBe(plain.choices[0]!.text);
    const c = steered.choices[0]!;
    const t = steered.activations!.residual_stream;
    expect(t.shape).toEqual([2, c.prompt_token_ids.length + c.token_ids.length - 1, 4096]);
    const decoded = await decodeTensorDict(t, 1 << 26);
    expect(decoded.data.every(Number.isFinite)).toBe(true);
  });
});
