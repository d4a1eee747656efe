// Every key vLLM writes in a completion, a choice, a chunk and a usage object is in ours — null when
// its option was not asked for — so code written against vLLM reads our answers unchanged. The key
// lists are vLLM's serialization (≈ 0.19, the version vllm-lens pins): a non-streamed answer is
// `CompletionResponse.model_dump()` (every field); a text chunk is `CompletionStreamResponse`
// dumped with every field (`usage: null`); the usage chunk drops nulls. REST and SSE, structures
// compared after parsing (exact key sets: toStrictEqual).
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { CompletionChunkJson, CompletionJson } from "../../src/surfaces/rest/render-completion.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});
// Every response also conforms to /openapi.json.
afterEach(assertConforming);

const base = { model: "tiny", prompt: "Hi", max_tokens: 2, temperature: 0, ignore_eos: true };

async function complete(body: Record<string, unknown>): Promise<CompletionJson> {
  const res = await checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...base, ...body }),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return JSON.parse(text) as CompletionJson;
}

async function stream(body: Record<string, unknown>): Promise<CompletionChunkJson[]> {
  const res = await checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...base, ...body, stream: true }),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return sseChunks<CompletionChunkJson>(text);
}

const head = {
  id: expect.stringMatching(/^cmpl-[0-9a-f]{32}$/),
  object: "text_completion",
  created: expect.any(Number),
  model: "tiny",
};
const usage = {
  prompt_tokens: expect.any(Number),
  total_tokens: expect.any(Number),
  completion_tokens: expect.any(Number),
};
const logprobs = {
  tokens: expect.any(Array),
  token_logprobs: expect.any(Array),
  top_logprobs: expect.any(Array),
  text_offset: expect.any(Array),
};
const finishReason = expect.toBeOneOf([null, "length"]);

/** A non-streamed answer with vLLM's keys; `choice` overrides a choice's null keys. */
function completion(choice: Record<string, unknown> = {}, n = 1) {
  return {
    ...head,
    choices: Array.from({ length: n }, (_, index) => ({
      index,
      text: expect.any(String),
      logprobs: null,
      finish_reason: "length",
      stop_reason: null,
      token_ids: null,
      prompt_logprobs: null,
      prompt_token_ids: null,
      ...choice,
    })),
    service_tier: null,
    system_fingerprint: null,
    usage: { ...usage, prompt_tokens_details: null },
    kv_transfer_params: null,
  };
}

/** A text chunk with vLLM's keys; `choice` overrides its null keys. */
function textChunk(choice: Record<string, unknown> = {}, chunkUsage: unknown = null) {
  return {
    ...head,
    choices: [
      {
        index: expect.any(Number),
        text: expect.any(String),
        logprobs: null,
        finish_reason: finishReason,
        stop_reason: null,
        prompt_token_ids: null,
        token_ids: null,
        ...choice,
      },
    ],
    usage: chunkUsage,
  };
}

/** The usage chunk: vLLM drops its null keys (no prompt_tokens_details). */
const usageChunk = { ...head, choices: [], usage };

describe("response shapes: every key vLLM writes, null when not asked for", () => {
  it("REST, no options: prompt_logprobs, token_ids, prompt_token_ids, service_tier, system_fingerprint, kv_transfer_params, usage.prompt_tokens_details are null", async () => {
    expect(await complete({})).toStrictEqual(completion());
  });

  it("REST, logprobs: the column-wise object", async () => {
    expect(await complete({ logprobs: 1 })).toStrictEqual(completion({ logprobs }));
  });

  it("REST, return_token_ids: prompt_token_ids and token_ids are lists", async () => {
    const res = await complete({ return_token_ids: true });
    expect(res).toStrictEqual(
      completion({
        prompt_token_ids: stack.engine?.model.tokenize("Hi"),
        token_ids: [expect.any(Number), expect.any(Number)],
      }),
    );
  });

  it("REST, prompt_logprobs: a list whose first position is null", async () => {
    const res = await complete({ prompt_logprobs: 1 });
    expect(res).toStrictEqual(completion({ prompt_logprobs: expect.any(Array) }));
    expect(res.choices[0]?.prompt_logprobs?.[0]).toBeNull();
    expect(res.choices[0]?.prompt_logprobs?.[1]).toStrictEqual(expect.any(Object));
  });

  it("REST, several prompts and n = 2: every choice has every key", async () => {
    const res = await complete({ prompt: ["Hi", "Yo"], n: 2, temperature: 1, seed: 1 });
    expect(res).toStrictEqual(completion({}, 4));
  });

  it("REST, output_residual_stream: activations besides vLLM's keys", async () => {
    const res = await complete({ output_residual_stream: [0] });
    expect(res).toStrictEqual({ ...completion(), activations: { residual_stream: expect.any(Object) } });
  });

  it("SSE, no options: every text chunk has usage null and every choice key (null)", async () => {
    const chunks = await stream({});
    expect(chunks).toStrictEqual([textChunk(), textChunk()]);
    expect(chunks.at(-1)?.choices[0]?.finish_reason).toBe("length");
  });

  it("SSE, logprobs: the column-wise object on every chunk", async () => {
    expect(await stream({ logprobs: 1 })).toStrictEqual([textChunk({ logprobs }), textChunk({ logprobs })]);
  });

  it("SSE, return_token_ids: prompt_token_ids on a choice's first chunk only, token_ids on every chunk", async () => {
    const ids = [expect.any(Number)];
    expect(await stream({ return_token_ids: true })).toStrictEqual([
      textChunk({ prompt_token_ids: stack.engine?.model.tokenize("Hi"), token_ids: ids }),
      textChunk({ token_ids: ids }),
    ]);
  });

  it("SSE, include_usage: text chunks with usage null, then the usage chunk", async () => {
    const chunks = await stream({ stream_options: { include_usage: true } });
    expect(chunks).toStrictEqual([textChunk(), textChunk(), usageChunk]);
  });

  it("SSE, include_usage and continuous_usage_stats: the usage so far on every text chunk", async () => {
    const chunks = await stream({ stream_options: { include_usage: true, continuous_usage_stats: true } });
    const soFar = { ...usage, prompt_tokens_details: null };
    expect(chunks).toStrictEqual([textChunk({}, soFar), textChunk({}, soFar), usageChunk]);
  });

  it("SSE, output_residual_stream: the activations chunk has usage null", async () => {
    const chunks = await stream({ output_residual_stream: [0], stream_options: { include_usage: true } });
    expect(chunks).toStrictEqual([
      textChunk(),
      textChunk(),
      usageChunk,
      { ...head, choices: [], usage: null, activations: { residual_stream: expect.any(Object) } },
    ]);
  });

  it("SSE, echo and continuous_usage_stats: the prompt's own chunk carries the usage so far too", async () => {
    const chunks = await stream({
      echo: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    });
    expect(chunks.length).toBeGreaterThanOrEqual(3);
    expect(chunks[0]?.choices[0]?.text).toBe("Hi");
    for (const chunk of chunks) expect(chunk.usage, JSON.stringify(chunk)).not.toBeNull();
    expect(chunks[0]?.usage).toStrictEqual(expect.objectContaining({ prompt_tokens: usage.prompt_tokens }));
  });

  it("SSE, output_residual_stream and continuous_usage_stats: the activations chunk carries the usage so far", async () => {
    const chunks = await stream({
      output_residual_stream: [0],
      stream_options: { include_usage: true, continuous_usage_stats: true },
    });
    const last = chunks.at(-1);
    expect(last?.activations).toBeDefined();
    for (const chunk of chunks) expect(chunk.usage, JSON.stringify(chunk)).not.toBeNull();
    expect(last?.usage).toStrictEqual(expect.objectContaining({ total_tokens: usage.total_tokens }));
  });

  it("SSE, a lens fan-out with continuous_usage_stats: every chunk, activations too, carries the usage so far", async () => {
    const chunks = await stream({
      prompt: ["Hi", "Yo"],
      output_residual_stream: [0],
      stream_options: { include_usage: true, continuous_usage_stats: true },
    });
    expect(chunks.filter((c) => c.choices.some((x) => x.activations !== undefined))).toHaveLength(2);
    for (const chunk of chunks) expect(chunk.usage, JSON.stringify(chunk)).not.toBeNull();
  });

  it.each([
    ["one request to Inference", {}],
    ["a lens fan-out", { output_residual_stream: [0] }],
  ])(
    "SSE, several prompts and n = 2 with continuous_usage_stats, %s: each chunk carries its own choice's usage so far, as vLLM's",
    async (_name, extra) => {
      const prompts = ["Hi", "Hello there"];
      const chunks = await stream({
        ...extra,
        prompt: prompts,
        n: 2,
        max_tokens: 3,
        temperature: 1,
        seed: 7,
        return_token_ids: true,
        stream_options: { include_usage: true, continuous_usage_stats: true },
      });
      const generated = new Map<number, number>();
      for (const chunk of chunks) {
        const choice = chunk.choices[0];
        if (choice === undefined || choice.activations !== undefined) continue; // usage, activations
        const index = choice.index;
        generated.set(index, (generated.get(index) ?? 0) + (choice.token_ids?.length ?? 0));
        const promptTokens = stack.engine?.model.tokenize(prompts[Math.floor(index / 2)] as string).length;
        expect(chunk.usage, JSON.stringify(chunk)).toStrictEqual({
          prompt_tokens: promptTokens,
          completion_tokens: generated.get(index),
          total_tokens: (promptTokens as number) + (generated.get(index) as number),
          prompt_tokens_details: null,
        });
      }
      expect([...generated.values()]).toStrictEqual([3, 3, 3, 3]);
      expect(chunks.at(-1)?.usage?.completion_tokens).toBe(12);
    },
  );

  it("SSE, several prompts and n = 2: every chunk of every choice has every key", async () => {
    const chunks = await stream({ prompt: ["Hi", "Yo"], n: 2, temperature: 1, seed: 1 });
    expect(chunks).toHaveLength(8);
    expect(chunks).toStrictEqual(Array.from({ length: 8 }, () => textChunk()));
    expect(new Set(chunks.map((c) => c.choices[0]?.index))).toStrictEqual(new Set([0, 1, 2, 3]));
  });
});
