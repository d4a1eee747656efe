// bad_words end to end (proto/API.md §2): the official openai SDK over REST and a Connect client
// against the real gateway and the reference engine. A banned word changes the answer the same way
// on both surfaces (the gateway passes the words on, the engine bans them as vLLM does), and a bad
// bad_words gets one envelope on REST and Connect before Inference sees the request.
import { create } from "@bufbuild/protobuf";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let openai: OpenAI;
let connect: ReturnType<typeof createClient<typeof CompletionsService>>;

beforeAll(async () => {
  stack = await startStack();
  openai = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: "unused", maxRetries: 0, fetch: checkedFetch });
  connect = createClient(
    CompletionsService,
    createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1", useBinaryFormat: true }),
  );
});
afterAll(async () => {
  await stack.close();
});
afterEach(assertConforming);

// The tiny preset (one token per byte) writes "ot" greedily after this prompt: banning "ot" means
// "t" is never generated right after "o".
const greedy = { prompt: "Alice was", max_tokens: 30, temperature: 0, ignore_eos: true };

/** REST through the SDK; bad_words is not in its types, so the params are cast (as extra_body). */
async function restText(extra: Record<string, unknown> = {}): Promise<string> {
  const params = { model: stack.alias, ...greedy, ...extra } as OpenAI.CompletionCreateParamsNonStreaming;
  return (await openai.completions.create(params)).choices[0]?.text ?? "";
}

async function connectText(badWords: string[]): Promise<string> {
  const request = create(CreateCompletionRequestSchema, {
    model: stack.alias,
    prompt: { case: "text", value: greedy.prompt },
    maxTokens: greedy.max_tokens,
    temperature: greedy.temperature,
    ignoreEos: greedy.ignore_eos,
    badWords,
  });
  return (await connect.createCompletion(request)).choices[0]?.text ?? "";
}

const received = () => stack.engine?.stats.received ?? Number.NaN;

describe("bad_words changes the answer, on REST and Connect alike", () => {
  it("REST (openai SDK): without it the text holds 'ot'; with it, never, and Inference's own answer is the same", async () => {
    const free = await restText();
    expect(free).toContain("ot");
    const banned = await restText({ bad_words: ["ot"] });
    expect(banned).not.toContain("ot");
    expect(banned).not.toBe(free);
    const direct = await fetch(`${stack.engine?.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: stack.modelId, ...greedy, bad_words: ["ot"] }),
    });
    const json = (await direct.json()) as { choices: { text: string }[] };
    expect(banned).toBe(json.choices[0]?.text);
  });

  it("REST stream (openai SDK): the streamed text never holds the word either", async () => {
    const params = { model: stack.alias, ...greedy, bad_words: ["ot"], stream: true };
    const stream = await openai.completions.create(params as OpenAI.CompletionCreateParamsStreaming);
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
    expect(text).toBe(await restText({ bad_words: ["ot"] }));
    expect(text).not.toContain("ot");
  });

  it("Connect: the same words give REST's text; none gives the free text", async () => {
    const banned = await connectText(["ot"]);
    expect(banned).not.toContain("ot");
    expect(banned).toBe(await restText({ bad_words: ["ot"] }));
    expect(await connectText([])).toBe(await restText());
  });
});

interface Envelope {
  message: string;
  type: string;
  param: string | null;
  code: string | undefined;
}

async function restError(body: string): Promise<{ status: number; error: Envelope }> {
  const res = await checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  return { status: res.status, error: ((await res.json()) as { error: Envelope }).error };
}

async function connectBinaryError(badWords: string[]): Promise<Envelope | undefined> {
  const request = create(CreateCompletionRequestSchema, {
    model: stack.alias,
    prompt: { case: "text", value: "Hi" },
    maxTokens: 2,
    badWords,
  });
  const err = await connect.createCompletion(request).then(
    () => undefined,
    (e: unknown) => ConnectError.from(e),
  );
  const error = err?.findDetails(ErrorEnvelopeSchema)[0]?.error;
  return error && { message: error.message, type: error.type, param: error.param ?? null, code: error.code };
}

async function connectJsonError(body: string): Promise<{ status: number; error: Envelope }> {
  const res = await fetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  const json = (await res.json()) as { details?: { debug: { error: Envelope } }[] };
  const error = json.details?.[0]?.debug.error as Envelope;
  return { status: res.status, error: { ...error, param: error.param ?? null } };
}

describe("a bad bad_words: one envelope on REST and Connect; Inference never sees it", () => {
  it.each([
    ["65 words", Array.from({ length: 65 }, (_, i) => `w${i}`), "must contain no more than 64 items"],
    ["a word of 101 characters", ["x".repeat(101)], "must be at most 100 characters"],
    ["an empty word", ["ot", ""], "must not be empty"],
  ])("%s → 400 invalid_request, param bad_words", async (_name, words, rule) => {
    const before = received();
    const rest = await restError(
      JSON.stringify({ model: stack.alias, prompt: "Hi", max_tokens: 2, bad_words: words }),
    );
    expect(rest.status).toBe(400);
    expect(rest.error).toStrictEqual({
      message: `Invalid value for 'bad_words': ${rule}.`,
      type: "invalid_request_error",
      param: "bad_words",
      code: "invalid_request",
    });
    expect(await connectBinaryError(words)).toStrictEqual(rest.error);
    expect(received()).toBe(before);
  });

  it.each([
    ['"ot"', "bad_words", "Invalid type for 'bad_words': expected an array."],
    ['["ot", 1]', "bad_words[1]", "Invalid type for 'bad_words[1]': expected a string."],
    ['["ot", null]', "bad_words[1]", "Invalid value for 'bad_words[1]': a list item cannot be null."],
  ])("bad_words %s (a wrong type) → the same 400 on REST and Connect JSON", async (words, param, message) => {
    const before = received();
    const rest = await restError(
      `{"model":"${stack.alias}","prompt":"Hi","max_tokens":2,"bad_words":${words}}`,
    );
    const json = await connectJsonError(
      `{"model":"${stack.alias}","text":"Hi","max_tokens":2,"bad_words":${words}}`,
    );
    expect(rest.status).toBe(400);
    expect(json.status).toBe(400);
    expect(rest.error).toStrictEqual({
      message,
      type: "invalid_request_error",
      param,
      code: "invalid_request",
    });
    expect(json.error).toStrictEqual(rest.error);
    expect(received()).toBe(before);
  });

  it("a word of whitespace only passes the gateway; Inference refuses it, param bad_words, on both surfaces", async () => {
    const rest = await restError(
      JSON.stringify({ model: stack.alias, prompt: "Hi", max_tokens: 2, bad_words: [" "] }),
    );
    expect(rest.status).toBe(400);
    expect(rest.error.param).toBe("bad_words");
    expect(await connectBinaryError([" "])).toStrictEqual(rest.error);
  });
});
