// End to end with the official openai SDK against the real gateway and the reference engine.
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let client: OpenAI;

beforeAll(async () => {
  stack = await startStack();
  // Every response the SDK gets is checked against /openapi.json (test/helpers/openapi-check.ts).
  client = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: "unused", maxRetries: 0, fetch: checkedFetch });
});
afterAll(async () => {
  await stack.close();
});
afterEach(assertConforming);

/** What the engine itself answers for the same body (Inference called directly). */
async function engineDirect(body: Record<string, unknown>) {
  const res = await fetch(`${stack.engine?.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, model: stack.modelId }),
  });
  return (await res.json()) as {
    choices: Array<{ text: string; index: number }>;
    usage: Record<string, number>;
  };
}

describe("openai SDK, non-stream", () => {
  it("returns the engine's greedy text, OpenAI's shape and exact usage", async () => {
    const body = { prompt: "Hello", max_tokens: 6, temperature: 0, ignore_eos: true };
    const before = Math.floor(Date.now() / 1000);
    const { data, response } = await client.completions
      .create({ model: stack.alias, ...body } as OpenAI.CompletionCreateParamsNonStreaming)
      .withResponse();
    const direct = await engineDirect(body);
    expect(data.object).toBe("text_completion");
    expect(data.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(data.model).toBe(stack.alias);
    // Unix seconds, stamped while the request ran
    expect(data.created).toBeGreaterThanOrEqual(before);
    expect(data.created).toBeLessThanOrEqual(Math.ceil(Date.now() / 1000));
    expect(data.choices).toHaveLength(1);
    expect(data.choices[0]?.text).toBe(direct.choices[0]?.text);
    expect(data.choices[0]?.finish_reason).toBe("length");
    expect(data.choices[0]?.logprobs).toBeNull();
    const promptTokens = stack.engine?.model.tokenize("Hello").length;
    expect(data.usage).toStrictEqual({
      prompt_tokens: promptTokens,
      total_tokens: (promptTokens ?? 0) + 6,
      completion_tokens: 6,
      prompt_tokens_details: null,
    });
    expect(response.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("serves several prompts with n = 2, choice index = prompt × n + sample", async () => {
    const res = await client.completions.create({
      model: stack.alias,
      prompt: ["One", "Two", "Three"],
      n: 2,
      max_tokens: 3,
      temperature: 1,
      seed: 7,
    });
    expect(res.choices.map((c) => c.index)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(res.usage?.completion_tokens).toBeLessThanOrEqual(18);
    const again = await client.completions.create({
      model: stack.alias,
      prompt: ["One", "Two", "Three"],
      n: 2,
      max_tokens: 3,
      temperature: 1,
      seed: 7,
    });
    expect(again.choices.map((c) => c.text)).toEqual(res.choices.map((c) => c.text));
  });

  it("takes token-id prompts (no BOS added) and returns token ids when asked", async () => {
    const ids = [72, 101, 108, 108, 111];
    const res = await client.completions.create({
      model: stack.alias,
      prompt: ids,
      max_tokens: 4,
      temperature: 0,
      // vLLM fields travel as extra body keys
      return_token_ids: true,
      top_k: 5,
      min_p: 0.01,
      repetition_penalty: 1.1,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const choice = res.choices[0] as unknown as { prompt_token_ids: number[]; token_ids: number[] };
    expect(choice.prompt_token_ids).toEqual(ids);
    expect(choice.token_ids.length).toBeGreaterThan(0);
    expect(res.usage?.prompt_tokens).toBe(ids.length);
  });

  it("returns logprobs with top candidates, and echo prepends the prompt", async () => {
    const res = await client.completions.create({
      model: stack.alias,
      prompt: "abc",
      max_tokens: 4,
      temperature: 0,
      logprobs: 2,
      echo: true,
      ignore_eos: true,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const choice = res.choices[0];
    expect(choice?.text.startsWith("abc")).toBe(true);
    const lp = choice?.logprobs;
    expect(lp?.tokens?.length).toBe(lp?.token_logprobs?.length);
    expect(lp?.text_offset?.length).toBe(lp?.tokens?.length);
    // The first echoed token has no logprob (null), the generated ones do.
    expect(lp?.token_logprobs?.[0]).toBeNull();
    const last = lp?.top_logprobs?.[(lp?.top_logprobs?.length ?? 1) - 1] ?? {};
    expect(Object.keys(last).length).toBeGreaterThanOrEqual(1);
    for (const v of Object.values(last)) expect(v).toBeLessThanOrEqual(0);
  });
});

describe("openai SDK, stream", () => {
  it("streams the same text as the non-stream answer, then the usage chunk", async () => {
    const body = { prompt: "The sky", max_tokens: 8, temperature: 0, ignore_eos: true };
    const full = await client.completions.create({
      model: stack.alias,
      ...body,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const stream = await client.completions.create({
      model: stack.alias,
      ...body,
      stream: true,
      stream_options: { include_usage: true },
    } as OpenAI.CompletionCreateParamsStreaming);
    const chunks: OpenAI.Completion[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const text = chunks.flatMap((c) => c.choices.map((ch) => ch.text)).join("");
    expect(text).toBe(full.choices[0]?.text);
    const ids = new Set(chunks.map((c) => c.id));
    expect(ids.size).toBe(1);
    const last = chunks[chunks.length - 1];
    expect(last?.choices).toEqual([]);
    // The usage chunk has the same counts; like vLLM's, it leaves out the null prompt_tokens_details.
    const { prompt_tokens_details, ...counts } = full.usage ?? {};
    expect(prompt_tokens_details).toBeNull();
    expect(last?.usage).toStrictEqual(counts);
    const finishes = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason));
    expect(finishes.filter((f) => f !== null)).toEqual(["length"]);
    expect(finishes[finishes.length - 1]).toBe("length");
  });
});

describe("openai SDK, errors", () => {
  it("surfaces a 400 as BadRequestError with code, param, type and the request id", async () => {
    const err = await client.completions
      .create({
        model: stack.alias,
        prompt: "x",
        max_tokens: "2",
      } as unknown as OpenAI.CompletionCreateParamsNonStreaming)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    const e = err as InstanceType<typeof OpenAI.BadRequestError>;
    expect(e.status).toBe(400);
    expect(e.code).toBe("invalid_request");
    expect(e.param).toBe("max_tokens");
    expect(e.type).toBe("invalid_request_error");
    expect(e.message).toContain("Invalid type for 'max_tokens': expected a number.");
    expect(e.requestID).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("surfaces an unknown model as NotFoundError", async () => {
    const err = await client.completions
      .create({ model: "nope", prompt: "x", max_tokens: 1 })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).code).toBe("model_not_found");
    expect((err as InstanceType<typeof OpenAI.NotFoundError>).param).toBe("model");
  });

  it("refuses streams with a real HTTP status before the first byte", async () => {
    const err = await client.completions
      .create({
        model: stack.alias,
        prompt: "x",
        max_tokens: 2,
        stream: true,
        prompt_logprobs: 1,
      } as OpenAI.CompletionCreateParamsStreaming)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("prompt_logprobs");
  });

  it("lists models, including the alias", async () => {
    const list = await client.models.list();
    // every name a request may use as `model`: the id, then its aliases
    expect(list.data.map((m) => [m.id, (m as unknown as { root: string }).root])).toEqual([
      [stack.modelId, stack.modelId],
      [stack.alias, stack.modelId],
    ]);
    const one = await client.models.retrieve(stack.alias);
    expect(one.id).toBe(stack.alias);
    expect((one as unknown as { root: string }).root).toBe(stack.modelId);
  });
});

describe("a non-streamed answer is Inference's stream collected", () => {
  it.each([
    [
      "logprobs + echo",
      { prompt: "abc", max_tokens: 6, temperature: 0, logprobs: 3, echo: true, ignore_eos: true },
    ],
    ["stop string", { prompt: "The sky", max_tokens: 40, temperature: 0, stop: ["e"] }],
    ["n = 2, two prompts, seed", { prompt: ["One", "Two"], n: 2, max_tokens: 5, temperature: 1, seed: 11 }],
    ["stop token id", { prompt: [72, 105], max_tokens: 30, temperature: 0, stop_token_ids: [101, 32] }],
  ])("equals Inference's own non-streamed answer: %s", async (_name, body) => {
    const direct = (await engineDirect(body)) as unknown as {
      choices: Array<Record<string, unknown>>;
      usage: unknown;
    };
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: stack.alias, ...body }),
    });
    const ours = (await res.json()) as { choices: Array<Record<string, unknown>>; usage: unknown };
    // text_offset aside: Inference's are sums of token lengths (17 for an echoed BOS), ours point
    // into the text (test/integration/text-offset.property.test.ts).
    const strip = (c: Record<string, unknown>) => {
      const { text_offset, ...logprobs } = (c.logprobs ?? {}) as Record<string, unknown>;
      return {
        index: c.index,
        text: c.text,
        logprobs: c.logprobs === null ? null : logprobs,
        finish_reason: c.finish_reason,
        stop_reason: c.stop_reason,
      };
    };
    expect(ours.choices.map(strip)).toEqual(direct.choices.map(strip));
    const counts = (u: unknown) => {
      const { prompt_tokens, completion_tokens, total_tokens } = u as Record<string, number>;
      return { prompt_tokens, completion_tokens, total_tokens };
    };
    expect(counts(ours.usage)).toStrictEqual(counts(direct.usage));
  });
});
