import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import { isJsonNumber, parseStrictJson, readExactInteger } from "../../src/core/json/strict-json.js";
import { jsonText, jsonTextByteLength, jsonTextChunks } from "../../src/core/json-text/index.js";
import {
  buildVllmRequest,
  serializeVllmRequest,
  vllmRequestBody,
  vllmRequestJson,
} from "../../src/upstream/index.js";

const resolved = { servedModelName: "meta-llama/Llama-3.1-8B", maxTokens: 16, stream: false, vllmXargs: {} };
type Init = MessageInitShape<typeof CreateCompletionRequestSchema>;
const text = (init: Omit<Init, "$typeName"> = {}) =>
  create(CreateCompletionRequestSchema, {
    model: "llama-8b",
    prompt: { case: "text", value: "Hello" },
    ...init,
  });

describe("buildVllmRequest", () => {
  it("sends every sampling value explicitly with OpenAI's defaults or the off value", () => {
    const body = buildVllmRequest(text(), resolved);
    expect(JSON.parse(serializeVllmRequest(body))).toStrictEqual({
      model: "meta-llama/Llama-3.1-8B",
      prompt: "Hello",
      max_tokens: 16,
      n: 1,
      temperature: 1,
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
      return_token_ids: false,
      stream: false,
    });
  });

  it("passes every set value through, and zero values stay zero", () => {
    const req = create(CreateCompletionRequestSchema, {
      model: "llama-8b",
      prompt: { case: "text", value: "x" },
      n: 3,
      temperature: 0,
      topP: 0.5,
      topK: 7,
      minP: 0.1,
      repetitionPenalty: 1.2,
      presencePenalty: -0.5,
      frequencyPenalty: 0.25,
      minTokens: 2,
      ignoreEos: true,
      stop: ["\n", "END"],
      stopTokenIds: [0, 128001],
      includeStopStrInOutput: true,
      skipSpecialTokens: false,
      spacesBetweenSpecialTokens: false,
      addSpecialTokens: false,
      echo: true,
      logprobs: 0,
      promptLogprobs: 0,
      returnTokenIds: true,
      priority: -3,
      user: "u-1",
    });
    const body = JSON.parse(
      serializeVllmRequest(
        buildVllmRequest(req, { ...resolved, vllmXargs: { output_residual_stream: "[1, 2]" } }),
      ),
    );
    expect(body).toMatchObject({
      n: 3,
      temperature: 0,
      top_p: 0.5,
      top_k: 7,
      min_p: 0.1,
      repetition_penalty: 1.2,
      presence_penalty: -0.5,
      frequency_penalty: 0.25,
      min_tokens: 2,
      ignore_eos: true,
      stop: ["\n", "END"],
      stop_token_ids: [0, 128001],
      include_stop_str_in_output: true,
      skip_special_tokens: false,
      spaces_between_special_tokens: false,
      add_special_tokens: false,
      echo: true,
      logprobs: 0,
      prompt_logprobs: 0,
      return_token_ids: true,
      priority: -3,
      user: "u-1",
      vllm_xargs: { output_residual_stream: "[1, 2]" },
    });
    expect(body).not.toHaveProperty("stream_options");
    expect(body).not.toHaveProperty("seed");
  });

  it("passes bad_words on under vLLM's name when there are some, and leaves them out when none", () => {
    const words = ["Alice", " rabbit", "ü"];
    const body = JSON.parse(serializeVllmRequest(buildVllmRequest(text({ badWords: words }), resolved)));
    expect(body.bad_words).toStrictEqual(words);
    expect(buildVllmRequest(text({ badWords: [] }), resolved)).not.toHaveProperty("bad_words");
    expect(serializeVllmRequest(buildVllmRequest(text(), resolved))).not.toContain("bad_words");
  });

  it("sends top_k 0 as -1 (off on every vLLM version) and omits priority 0", () => {
    const body = buildVllmRequest(text({ topK: 0, priority: 0 }), resolved);
    expect(body.top_k).toBe(-1);
    expect(body).not.toHaveProperty("priority");
  });

  it.each([
    ["text", { case: "text", value: "a" }, "a"],
    ["texts", { case: "texts", value: { values: ["a", "b"] } }, ["a", "b"]],
    ["tokenIds", { case: "tokenIds", value: { values: [1, 2, 3] } }, [1, 2, 3]],
    [
      "tokenIdsList",
      { case: "tokenIdsList", value: { values: [{ values: [1] }, { values: [2, 3] }] } },
      [[1], [2, 3]],
    ],
  ] satisfies [string, Init["prompt"], unknown][])("sends the %s prompt form", (_, prompt, expected) => {
    const req = create(CreateCompletionRequestSchema, { model: "m", prompt });
    expect(JSON.parse(serializeVllmRequest(buildVllmRequest(req, resolved))).prompt).toStrictEqual(expected);
  });

  it("refuses a request without a prompt, and a max_tokens that is not an integer ≥ 1", () => {
    const none = create(CreateCompletionRequestSchema, { model: "m" });
    expect(() => buildVllmRequest(none, resolved)).toThrow(ApiError);
    for (const maxTokens of [0, 1.5, Number.NaN]) {
      expect(() => buildVllmRequest(text(), { ...resolved, maxTokens })).toThrow(RangeError);
    }
  });

  it("asks for include_usage on every stream and continuous_usage_stats only when asked", () => {
    const plain = buildVllmRequest(text(), { ...resolved, stream: true });
    expect(plain.stream_options).toStrictEqual({ include_usage: true, continuous_usage_stats: false });
    const req = text({ streamOptions: { includeUsage: false, continuousUsageStats: true } });
    expect(buildVllmRequest(req, { ...resolved, stream: true }).stream_options).toStrictEqual({
      include_usage: true,
      continuous_usage_stats: true,
    });
  });

  it.each([
    ["2^63 − 1", 9223372036854775807n],
    ["−2^63", -9223372036854775808n],
    ["2^53 + 1", 9007199254740993n],
    ["0", 0n],
  ])("writes seed %s as an exact JSON integer", (_, seed) => {
    const json = serializeVllmRequest(buildVllmRequest(text({ seed }), resolved));
    const parsed = parseStrictJson(json) as Record<string, unknown>;
    expect(isJsonNumber(parsed.seed) && readExactInteger(parsed.seed)).toEqual({
      kind: "integer",
      value: seed,
    });
    expect(json).toMatch(new RegExp(`"seed":${seed}[,}]`));
    expect(parsed.prompt).toBe("Hello");
  });

  it("never sends vllm_xargs when empty", () => {
    expect(buildVllmRequest(text(), resolved)).not.toHaveProperty("vllm_xargs");
  });

  it("without seed and vllm_xargs the text is the body's fields in their order, one string", () => {
    const body = buildVllmRequest(text({ prompt: { case: "text", value: "é€😀" } }), resolved);
    const { seed: _s, vllm_xargs: _x, ...rest } = body;
    expect(serializeVllmRequest(body)).toBe(JSON.stringify(rest));
    const { body: b, contentLength } = vllmRequestBody(body);
    expect(b).toBe(JSON.stringify(rest));
    expect(contentLength).toBe(Buffer.byteLength(b as string));
  });
});

describe("vllmRequestJson / vllmRequestBody: a steering list written in pieces", () => {
  // A JsonText as lens builds it: JSON with a tensor's bytes left as a base64 source.
  const bytes = Uint8Array.from({ length: 100_000 }, (_, i) => (i * 7919) & 0xff);
  const steering = jsonText([
    '[{"activations":{"data":"',
    { byteLength: bytes.length, chunks: () => [bytes.subarray(0, 4), bytes.subarray(4)] },
    '","dtype":"float32","shape":[1,25000]},"note":"quote \\" backslash \\\\ é"}]',
  ]);
  const body = () =>
    buildVllmRequest(text({ seed: 9223372036854775807n }), {
      ...resolved,
      stream: true,
      vllmXargs: { output_residual_stream: "[0, 1]", apply_steering_vectors: steering },
    });

  it("is the same JSON a whole serialization gives: vllm_xargs values are JSON strings holding JSON", () => {
    const json = serializeVllmRequest(body());
    const parsed = parseStrictJson(json) as Record<string, unknown>;
    expect(isJsonNumber(parsed.seed) && readExactInteger(parsed.seed)).toEqual({
      kind: "integer",
      value: 9223372036854775807n,
    });
    const xargs = parsed.vllm_xargs as Record<string, string>;
    expect(xargs.output_residual_stream).toBe("[0, 1]");
    expect(typeof xargs.apply_steering_vectors).toBe("string");
    const list = JSON.parse(xargs.apply_steering_vectors!) as Array<{
      activations: { data: string; dtype: string; shape: number[] };
      note: string;
    }>;
    expect(list[0]!.note).toBe('quote " backslash \\ é');
    expect(list[0]!.activations.shape).toEqual([1, 25000]);
    expect(Buffer.from(list[0]!.activations.data, "base64")).toEqual(Buffer.from(bytes));
    expect(parsed.stream).toBe(true);
  });

  it("streams exactly that text, Content-Length bytes long, never one piece over 64 KiB", async () => {
    const whole = serializeVllmRequest(body());
    const { body: stream, contentLength } = vllmRequestBody(body());
    expect(typeof stream).not.toBe("string");
    const pieces: Buffer[] = [];
    for await (const piece of stream as AsyncIterable<Buffer>) pieces.push(piece);
    const sent = Buffer.concat(pieces);
    expect(sent.toString("utf8")).toBe(whole);
    expect(contentLength).toBe(sent.length);
    const written = [...jsonTextChunks(vllmRequestJson(body()))];
    expect(written.length).toBeGreaterThan(3);
    expect(Math.max(...written.map((p) => p.length))).toBeLessThanOrEqual(64 * 1024);
    expect(jsonTextByteLength(vllmRequestJson(body()))).toBe(Buffer.byteLength(whole));
  });

  it("every call gives a fresh stream (a body can be sent twice)", async () => {
    const b = body();
    const read = async () => {
      const chunks: Buffer[] = [];
      for await (const c of vllmRequestBody(b).body as AsyncIterable<Buffer>) chunks.push(c);
      return Buffer.concat(chunks).toString("utf8");
    };
    expect(await read()).toBe(await read());
  });

  it("a body of plain strings is one string with its byte length", () => {
    const plain = buildVllmRequest(text({ prompt: { case: "text", value: "é€😀" } }), {
      ...resolved,
      vllmXargs: { output_residual_stream: "[1]" },
    });
    const { body: b, contentLength } = vllmRequestBody(plain);
    expect(b).toBe(serializeVllmRequest(plain));
    expect(contentLength).toBe(Buffer.byteLength(b as string));
  });
});
