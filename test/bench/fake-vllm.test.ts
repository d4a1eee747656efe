// The hot-path bench's fake vLLM (bench/hotpath/fake-vllm.ts): vLLM's shapes and uvicorn's framing,
// checked on the wire, and accepted by the gateway's own Inference client and by the gateway.
import type { AddressInfo, Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFakeVllm, fakeCompletionText, fakeTokenize } from "../../bench/hotpath/fake-vllm.js";
import { createVllmClient, newUpstreamRequestId } from "../../src/upstream/index.js";
import { configDefaults } from "../helpers/config-defaults.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

/** The Inference clients' silence bound: the configuration's default (ACS_UPSTREAM_HEADERS_TIMEOUT_MS). */
const silenceTimeoutMs = configDefaults.upstreamHeadersTimeoutMs;

/** Every write the server's sockets hand to the kernel, one string per write (or writev). */
const batches: string[] = [];
const fake = createFakeVllm({ model: "bench-model", chunks: 4, maxModelLen: 64 });
fake.on("connection", (socket: Socket) => {
  type Cb = (err?: Error | null) => void;
  const s = socket as unknown as {
    _write(chunk: Buffer | string, enc: BufferEncoding, cb: Cb): void;
    _writev(chunks: Array<{ chunk: Buffer | string; encoding: BufferEncoding }>, cb: Cb): void;
  };
  const write = s._write.bind(socket);
  const writev = s._writev.bind(socket);
  s._write = (chunk, enc, cb) => {
    batches.push(chunk.toString());
    write(chunk, enc, cb);
  };
  s._writev = (chunks, cb) => {
    batches.push(chunks.map((c) => c.chunk.toString()).join(""));
    writev(chunks, cb);
  };
});
let url: string;
beforeAll(async () => {
  await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
});
afterAll(async () => {
  fake.closeAllConnections();
  await new Promise((r) => fake.close(r));
});

/** The parts of vLLM's JSON answers the tests read. */
interface Answer {
  id: string;
  choices: Array<Record<string, unknown> & { index: number; text: string }>;
  usage: Record<string, unknown>;
  error: Record<string, unknown>;
  data: Array<Record<string, unknown>>;
  tokens: number[];
  [key: string]: unknown;
}
const json = async (res: Response): Promise<Answer> => (await res.json()) as Answer;

const post = (path: string, body: object, headers: Record<string, string> = {}) =>
  fetch(url + path, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });

describe("fake vLLM: shapes", () => {
  it("answers a non-stream completion in vLLM's field order, with token ids when asked", async () => {
    const res = await post(
      "/v1/completions",
      { model: "bench-model", prompt: "The sky is", max_tokens: 3, return_token_ids: true },
      { "x-request-id": "abc" },
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/json");
    const body = await json(res);
    expect(Object.keys(body)).toStrictEqual([
      "id",
      "object",
      "created",
      "model",
      "choices",
      "service_tier",
      "system_fingerprint",
      "usage",
      "kv_transfer_params",
    ]);
    const prompt = fakeTokenize("The sky is", true);
    expect(body).toMatchObject({ id: "cmpl-abc", object: "text_completion", model: "bench-model" });
    expect(body.choices).toStrictEqual([
      {
        index: 0,
        text: " the sky is",
        logprobs: null,
        finish_reason: "length",
        stop_reason: null,
        token_ids: [1000, 1001, 1002],
        prompt_logprobs: null,
        prompt_token_ids: prompt,
      },
    ]);
    expect(Object.keys(body.choices[0] ?? {})).toStrictEqual([
      "index",
      "text",
      "logprobs",
      "finish_reason",
      "stop_reason",
      "token_ids",
      "prompt_logprobs",
      "prompt_token_ids",
    ]);
    expect(body.usage).toStrictEqual({
      prompt_tokens: prompt.length,
      total_tokens: prompt.length + 3,
      completion_tokens: 3,
      prompt_tokens_details: null,
    });
  });

  it("stops at `chunks` tokens with finish_reason stop; n and several prompts make interleaved choices", async () => {
    const res = await post("/v1/completions", {
      model: "bench-model",
      prompt: [[1, 2], [3]],
      n: 2,
      max_tokens: 10,
    });
    const body = await json(res);
    expect(body.choices.map((c: { index: number }) => c.index)).toStrictEqual([0, 1, 2, 3]);
    for (const c of body.choices) {
      expect(c).toMatchObject({ text: fakeCompletionText(4), finish_reason: "stop", token_ids: null });
    }
    expect(body.usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 16, total_tokens: 19 });
  });

  it("streams one choice per chunk: prompt ids on the first, token ids on each, then the usage chunk and [DONE]", async () => {
    const res = await post("/v1/completions", {
      model: "bench-model",
      prompt: [7, 8, 9],
      max_tokens: 3,
      stream: true,
      return_token_ids: true,
      stream_options: { include_usage: true },
    });
    expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    const chunks = sseChunks(await res.text());
    expect(chunks).toHaveLength(4);
    const choices = chunks.slice(0, 3).map((c) => (c.choices as Array<Record<string, unknown>>)[0]);
    expect(choices).toStrictEqual([
      {
        index: 0,
        text: " the",
        logprobs: null,
        finish_reason: null,
        stop_reason: null,
        prompt_token_ids: [7, 8, 9],
        token_ids: [1000],
      },
      {
        index: 0,
        text: " sky",
        logprobs: null,
        finish_reason: null,
        stop_reason: null,
        prompt_token_ids: null,
        token_ids: [1001],
      },
      {
        index: 0,
        text: " is",
        logprobs: null,
        finish_reason: "length",
        stop_reason: null,
        prompt_token_ids: null,
        token_ids: [1002],
      },
    ]);
    for (const c of chunks.slice(0, 3)) expect(c.usage).toBeNull();
    // The usage chunk excludes nulls (pydantic exclude_none): no prompt_tokens_details.
    expect(chunks[3]).toMatchObject({
      choices: [],
      usage: { prompt_tokens: 3, total_tokens: 6, completion_tokens: 3 },
    });
    expect(Object.keys(chunks[3]?.usage as object)).toStrictEqual([
      "prompt_tokens",
      "total_tokens",
      "completion_tokens",
    ]);
  });

  it("sends no usage chunk without include_usage, and usage on every chunk with continuous_usage_stats", async () => {
    const plain = sseChunks(
      await (
        await post("/v1/completions", { model: "bench-model", prompt: "a", max_tokens: 2, stream: true })
      ).text(),
    );
    expect(plain).toHaveLength(2);
    expect(plain.every((c) => (c.choices as unknown[]).length === 1 && c.usage === null)).toBe(true);
    const continuous = sseChunks(
      await (
        await post("/v1/completions", {
          model: "bench-model",
          prompt: "a",
          max_tokens: 2,
          stream: true,
          stream_options: { include_usage: false, continuous_usage_stats: true },
        })
      ).text(),
    );
    expect(continuous.map((c) => (c.usage as { completion_tokens: number }).completion_tokens)).toStrictEqual(
      [1, 2],
    );
  });

  it("tokenizes with and without BOS; lists the model; answers /health with an empty 200", async () => {
    const t = await json(await post("/tokenize", { model: "bench-model", prompt: "one two three" }));
    expect(t).toMatchObject({ count: 4, max_model_len: 64, token_strs: null });
    expect(t.tokens[0]).toBe(128000);
    const noBos = await json(
      await post("/tokenize", { model: "bench-model", prompt: "one two three", add_special_tokens: false }),
    );
    expect(noBos.tokens).toStrictEqual(t.tokens.slice(1));
    const models = await json(await fetch(`${url}/v1/models`));
    expect(models.data[0]).toMatchObject({
      id: "bench-model",
      object: "model",
      max_model_len: 64,
      root: "bench-model",
    });
    const health = await fetch(`${url}/health`);
    expect(health.status).toBe(200);
    expect(await health.text()).toBe("");
  });

  it("refuses what it does not fake, and too long requests, with vLLM's error envelope", async () => {
    const lp = await post("/v1/completions", {
      model: "bench-model",
      prompt: "a",
      max_tokens: 2,
      logprobs: 1,
    });
    expect(lp.status).toBe(400);
    expect(await json(lp)).toStrictEqual({
      error: {
        message: "The bench fake does not implement logprobs.",
        type: "BadRequestError",
        param: "logprobs",
        code: 400,
      },
    });
    const long = await post("/v1/completions", { model: "bench-model", prompt: [1, 2, 3], max_tokens: 62 });
    expect(long.status).toBe(400);
    expect((await json(long)).error.param).toBe("input_tokens");
    const model = await post("/v1/completions", { model: "other", prompt: "a" });
    expect(model.status).toBe(404);
  });
});

describe("fake vLLM: uvicorn framing", () => {
  it("writes every event on its own, then [DONE], then the chunked terminator in a separate write", async () => {
    batches.length = 0;
    const res = await post("/v1/completions", {
      model: "bench-model",
      prompt: "a",
      max_tokens: 3,
      stream: true,
    });
    await res.text();
    const sse = batches.filter((b) => b.includes("data: ") || b === "0\r\n\r\n");
    expect(sse.map((b) => b.split("data: ").length - 1)).toStrictEqual([1, 1, 1, 1, 0]);
    expect(sse[3]).toMatch(/data: \[DONE\]\n\n\r\n$/);
    expect(sse[4]).toBe("0\r\n\r\n");
  });
});

describe("fake vLLM: hop delay", () => {
  it("adds at least hopMs before every answer", async () => {
    const slow = createFakeVllm({ hopMs: 60 });
    await new Promise<void>((r) => slow.listen(0, "127.0.0.1", r));
    const base = `http://127.0.0.1:${(slow.address() as AddressInfo).port}`;
    try {
      for (const path of ["/health", "/v1/models"]) {
        const t0 = performance.now();
        await (await fetch(base + path)).text();
        expect(performance.now() - t0).toBeGreaterThanOrEqual(59);
      }
    } finally {
      slow.closeAllConnections();
      await new Promise((r) => slow.close(r));
    }
  });
});

describe("fake vLLM behind the gateway's own code", () => {
  it("the Inference client parses its stream, completion, tokenize and model list", async () => {
    const client = createVllmClient({ baseUrl: url, silenceTimeoutMs });
    try {
      expect((await client.listModels()).data[0]?.max_model_len).toBe(64);
      expect((await client.tokenize("bench-model", "The sky is", true)).count).toBe(4);
      const body = {
        model: "bench-model",
        prompt: "The sky is",
        max_tokens: 4,
        n: 1,
        temperature: 0,
        top_p: 1,
        top_k: -1,
        min_p: 0,
        repetition_penalty: 1,
        presence_penalty: 0,
        frequency_penalty: 0,
        min_tokens: 0,
        ignore_eos: false,
        stop: [],
        stop_token_ids: [],
        include_stop_str_in_output: false,
        skip_special_tokens: true,
        spaces_between_special_tokens: true,
        add_special_tokens: true,
        echo: false,
        return_token_ids: true,
        stream: false,
      };
      const whole = await client.complete(body, {
        signal: new AbortController().signal,
        deadlineMs: 10_000,
        upstreamRequestId: newUpstreamRequestId(),
      });
      expect(whole.choices[0]?.text).toBe(fakeCompletionText(4));
      const chunks = [];
      for await (const c of client.stream(
        { ...body, stream: true, stream_options: { include_usage: true, continuous_usage_stats: false } },
        { signal: new AbortController().signal, upstreamRequestId: newUpstreamRequestId() },
      )) {
        chunks.push(c);
      }
      expect(chunks.map((c) => c.choices[0]?.text ?? "").join("")).toBe(whole.choices[0]?.text);
      expect(chunks.at(-1)?.usage).toStrictEqual(whole.usage && { ...whole.usage });
    } finally {
      await client.close();
    }
  });

  describe("the gateway in front of it", () => {
    let stack: Stack;
    beforeAll(async () => {
      stack = await startStack({
        upstreamUrl: url,
        model: { id: "bench-model", servedModelName: "bench-model", aliases: [], maxModelLen: undefined },
      });
    });
    afterAll(async () => {
      await stack?.close();
    });

    it("answers REST completions, non-stream and stream, with the fake's text", async () => {
      const body = { model: "bench-model", prompt: "The sky is", max_tokens: 4, temperature: 0 };
      const whole = await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      expect(whole.status).toBe(200);
      const answer = await json(whole);
      expect(answer.choices[0]?.text).toBe(fakeCompletionText(4));
      expect(answer.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: 4 });
      const stream = await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...body, stream: true }),
      });
      expect(stream.status).toBe(200);
      const chunks = sseChunks(await stream.text());
      expect(chunks).toHaveLength(4);
      expect(chunks.map((c) => (c.choices as Array<{ text: string }>)[0]?.text).join("")).toBe(
        fakeCompletionText(4),
      );
    });
  });
});
