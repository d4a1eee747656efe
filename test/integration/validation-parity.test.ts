// Every rule of proto/API.md §2–§4 and §8, over REST and (where proto can express the request) over
// Connect, asserting status, type, code, param, identical envelopes, and that Inference never saw
// the request.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let client: ReturnType<typeof createClient<typeof CompletionsService>>;

beforeAll(async () => {
  stack = await startStack();
  client = createClient(
    CompletionsService,
    createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1", useBinaryFormat: true }),
  );
});
afterAll(async () => {
  await stack.close();
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

/** Completion requests that reached Inference at all (refused there or not). */
function receivedByInference(): number {
  if (stack.engine === undefined) throw new Error("this test needs the reference engine");
  return stack.engine.stats.received;
}

type Init = MessageInitShape<typeof CreateCompletionRequestSchema>;
interface Case {
  name: string;
  rest: Record<string, unknown>;
  /** The same request as proto (undefined when only JSON can express it). */
  connect?: { init: Init; stream?: boolean };
  status: number;
  code: string;
  param: string | null;
  message?: string;
}

const text = { case: "text" as const, value: "Hi" };
const base = { model: "tiny", prompt: "Hi" };
const hidden = 64;

const cases: Case[] = [
  {
    name: "max_tokens 0",
    rest: { ...base, max_tokens: 0 },
    connect: { init: { model: "tiny", prompt: text, maxTokens: 0 } },
    status: 400,
    code: "invalid_request",
    param: "max_tokens",
  },
  {
    name: "n 0",
    rest: { ...base, n: 0, max_tokens: 1 },
    connect: { init: { model: "tiny", prompt: text, n: 0, maxTokens: 1 } },
    status: 400,
    code: "invalid_request",
    param: "n",
  },
  {
    name: "n 129",
    rest: { ...base, n: 129, max_tokens: 1 },
    connect: { init: { model: "tiny", prompt: text, n: 129, maxTokens: 1 } },
    status: 400,
    code: "invalid_request",
    param: "n",
  },
  {
    name: "n 2 greedy",
    rest: { ...base, n: 2, temperature: 0, max_tokens: 1 },
    connect: { init: { model: "tiny", prompt: text, n: 2, temperature: 0, maxTokens: 1 } },
    status: 400,
    code: "invalid_request",
    param: "n",
  },
  {
    name: "temperature 2.5",
    rest: { ...base, temperature: 2.5 },
    connect: { init: { model: "tiny", prompt: text, temperature: 2.5 } },
    status: 400,
    code: "invalid_request",
    param: "temperature",
  },
  {
    name: "top_p 0",
    rest: { ...base, top_p: 0 },
    connect: { init: { model: "tiny", prompt: text, topP: 0 } },
    status: 400,
    code: "invalid_request",
    param: "top_p",
  },
  {
    name: "top_p 1.5",
    rest: { ...base, top_p: 1.5 },
    connect: { init: { model: "tiny", prompt: text, topP: 1.5 } },
    status: 400,
    code: "invalid_request",
    param: "top_p",
  },
  {
    name: "five stop strings",
    rest: { ...base, stop: ["a", "b", "c", "d", "e"] },
    connect: { init: { model: "tiny", prompt: text, stop: ["a", "b", "c", "d", "e"] } },
    status: 400,
    code: "invalid_request",
    param: "stop",
  },
  {
    name: "empty stop string",
    rest: { ...base, stop: [""] },
    connect: { init: { model: "tiny", prompt: text, stop: [""] } },
    status: 400,
    code: "invalid_request",
    param: "stop",
  },
  {
    name: "logprobs 21",
    rest: { ...base, logprobs: 21 },
    connect: { init: { model: "tiny", prompt: text, logprobs: 21 } },
    status: 400,
    code: "invalid_request",
    param: "logprobs",
  },
  {
    name: "presence_penalty 3",
    rest: { ...base, presence_penalty: 3 },
    connect: { init: { model: "tiny", prompt: text, presencePenalty: 3 } },
    status: 400,
    code: "invalid_request",
    param: "presence_penalty",
  },
  {
    name: "frequency_penalty -2.5",
    rest: { ...base, frequency_penalty: -2.5 },
    connect: { init: { model: "tiny", prompt: text, frequencyPenalty: -2.5 } },
    status: 400,
    code: "invalid_request",
    param: "frequency_penalty",
  },
  {
    name: "user 257 chars",
    rest: { ...base, user: "u".repeat(257) },
    connect: { init: { model: "tiny", prompt: text, user: "u".repeat(257) } },
    status: 400,
    code: "invalid_request",
    param: "user",
  },
  {
    name: "top_k -2",
    rest: { ...base, top_k: -2 },
    connect: { init: { model: "tiny", prompt: text, topK: -2 } },
    status: 400,
    code: "invalid_request",
    param: "top_k",
  },
  {
    name: "min_p 1.5",
    rest: { ...base, min_p: 1.5 },
    connect: { init: { model: "tiny", prompt: text, minP: 1.5 } },
    status: 400,
    code: "invalid_request",
    param: "min_p",
  },
  {
    name: "repetition_penalty 0",
    rest: { ...base, repetition_penalty: 0 },
    connect: { init: { model: "tiny", prompt: text, repetitionPenalty: 0 } },
    status: 400,
    code: "invalid_request",
    param: "repetition_penalty",
  },
  {
    name: "min_tokens above max_tokens",
    rest: { ...base, min_tokens: 5, max_tokens: 3 },
    connect: { init: { model: "tiny", prompt: text, minTokens: 5, maxTokens: 3 } },
    status: 400,
    code: "invalid_request",
    param: "min_tokens",
  },
  {
    name: "negative stop_token_ids",
    rest: { ...base, stop_token_ids: [-1] },
    connect: { init: { model: "tiny", prompt: text, stopTokenIds: [-1] } },
    status: 400,
    code: "invalid_request",
    param: "stop_token_ids",
  },
  {
    name: "prompt_logprobs 21",
    rest: { ...base, prompt_logprobs: 21 },
    connect: { init: { model: "tiny", prompt: text, promptLogprobs: 21 } },
    status: 400,
    code: "invalid_request",
    param: "prompt_logprobs",
  },
  {
    name: "prompt_logprobs with stream",
    rest: { ...base, prompt_logprobs: 1, stream: true },
    connect: { init: { model: "tiny", prompt: text, promptLogprobs: 1 }, stream: true },
    status: 400,
    code: "invalid_request",
    param: "prompt_logprobs",
  },
  {
    name: "stream_options without stream",
    rest: { ...base, stream_options: { include_usage: true } },
    connect: { init: { model: "tiny", prompt: text, streamOptions: { includeUsage: true } } },
    status: 400,
    code: "invalid_request",
    param: "stream_options",
  },
  {
    name: "several prompts without max_tokens",
    rest: { model: "tiny", prompt: ["a", "b"] },
    connect: { init: { model: "tiny", prompt: { case: "texts", value: { values: ["a", "b"] } } } },
    status: 400,
    code: "invalid_request",
    param: "max_tokens",
  },
  {
    name: "n 2 without max_tokens",
    rest: { ...base, n: 2 },
    connect: { init: { model: "tiny", prompt: text, n: 2 } },
    status: 400,
    code: "invalid_request",
    param: "max_tokens",
  },
  {
    name: "size cap (the seed's example)",
    rest: { model: "tiny", prompt: "The sky is", max_tokens: 16001, n: 2 },
    connect: {
      init: { model: "tiny", prompt: { case: "text", value: "The sky is" }, maxTokens: 16001, n: 2 },
    },
    status: 400,
    code: "invalid_request",
    param: "max_tokens",
    message:
      "At most 32000 generated tokens in all: n = 2 times max_tokens = 16001 for each of 1 prompts is 32002.",
  },
  {
    name: "deadline_infeasible",
    rest: { ...base, max_tokens: 15601 },
    connect: { init: { model: "tiny", prompt: text, maxTokens: 15601 } },
    status: 400,
    code: "deadline_infeasible",
    param: "max_tokens",
  },
  {
    name: "prompt too long",
    rest: { ...base, max_tokens: 15601, stream: true },
    connect: { init: { model: "tiny", prompt: text, maxTokens: 15601 }, stream: true },
    status: 400,
    code: "context_length_exceeded",
    param: "prompt",
  },
  {
    name: "unknown model",
    rest: { model: "nope", prompt: "Hi" },
    connect: { init: { model: "nope", prompt: text } },
    status: 404,
    code: "model_not_found",
    param: "model",
  },
  {
    name: "missing model",
    rest: { prompt: "Hi" },
    connect: { init: { prompt: text } },
    status: 400,
    code: "invalid_request",
    param: "model",
  },
  {
    name: "missing prompt",
    rest: { model: "tiny" },
    connect: { init: { model: "tiny" } },
    status: 400,
    code: "invalid_request",
    param: "prompt",
  },
  {
    name: "empty prompt",
    rest: { model: "tiny", prompt: "" },
    connect: { init: { model: "tiny", prompt: { case: "text", value: "" } } },
    status: 400,
    code: "invalid_request",
    param: "prompt",
  },
  {
    name: "negative token id",
    rest: { model: "tiny", prompt: [1, -1] },
    connect: { init: { model: "tiny", prompt: { case: "tokenIds", value: { values: [1, -1] } } } },
    status: 400,
    code: "invalid_request",
    param: "prompt",
  },
  {
    name: "capture layer out of range",
    rest: { ...base, max_tokens: 2, output_residual_stream: [4] },
    connect: {
      init: { model: "tiny", prompt: text, maxTokens: 2, outputResidualStream: { layerIndices: [4] } },
    },
    status: 400,
    code: "invalid_request",
    param: "output_residual_stream",
  },
  {
    name: "capture with n 2 (a fan-out) of a layer out of range",
    rest: { ...base, max_tokens: 2, n: 2, output_residual_stream: [0, 4] },
    connect: {
      init: {
        model: "tiny",
        prompt: text,
        maxTokens: 2,
        n: 2,
        outputResidualStream: { layerIndices: [0, 4] },
      },
    },
    status: 400,
    code: "invalid_request",
    param: "output_residual_stream",
  },
  {
    name: "steering vector of the wrong hidden size",
    rest: {
      ...base,
      max_tokens: 2,
      apply_steering_vectors: [{ activations: [[...Array(hidden + 1).fill(0.5)]], layer_indices: [1] }],
    },
    status: 400,
    code: "invalid_request",
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "steering data 4 bytes short (dict and Tensor bytes)",
    rest: {
      ...base,
      max_tokens: 2,
      apply_steering_vectors: [
        {
          activations: { data: Buffer.alloc(252).toString("base64"), dtype: "float32", shape: [1, hidden] },
          layer_indices: [1],
        },
      ],
    },
    connect: {
      init: {
        model: "tiny",
        prompt: text,
        maxTokens: 2,
        applySteeringVectors: [
          { activations: { dtype: 3, shape: [1, hidden], data: new Uint8Array(252) }, layerIndices: [1] },
        ],
      },
    },
    status: 400,
    code: "invalid_request",
    param: "apply_steering_vectors[0].activations",
  },
  {
    name: "steering tensor of 4 dims",
    rest: {
      ...base,
      max_tokens: 2,
      apply_steering_vectors: [
        {
          activations: {
            data: Buffer.alloc(256).toString("base64"),
            dtype: "float32",
            shape: [1, 1, 1, hidden],
          },
          layer_indices: [1],
        },
      ],
    },
    connect: {
      init: {
        model: "tiny",
        prompt: text,
        maxTokens: 2,
        applySteeringVectors: [
          {
            activations: { dtype: 3, shape: [1, 1, 1, hidden], data: new Uint8Array(256) },
            layerIndices: [1],
          },
        ],
      },
    },
    status: 400,
    code: "invalid_request",
    param: "apply_steering_vectors[0].activations",
  },
  // JSON-only rules (types, unknown fields)
  {
    name: "max_tokens as a string (the seed's example)",
    rest: { model: "tiny", prompt: "The sky is", max_tokens: "2" },
    status: 400,
    code: "invalid_request",
    param: "max_tokens",
    message: "Invalid type for 'max_tokens': expected a number.",
  },
  {
    name: "best_of is unknown",
    rest: { ...base, best_of: 2 },
    status: 400,
    code: "invalid_request",
    param: "best_of",
  },
  {
    name: "suffix is unknown",
    rest: { ...base, suffix: "x" },
    status: 400,
    code: "invalid_request",
    param: "suffix",
  },
  {
    name: "logit_bias is unknown",
    rest: { ...base, logit_bias: {} },
    status: 400,
    code: "invalid_request",
    param: "logit_bias",
  },
  {
    name: "apply_hooks is unknown",
    rest: { ...base, apply_hooks: "x" },
    status: 400,
    code: "invalid_request",
    param: "apply_hooks",
  },
  {
    name: "temperature as a string",
    rest: { ...base, temperature: "1" },
    status: 400,
    code: "invalid_request",
    param: "temperature",
  },
  {
    name: "1 is not a boolean",
    rest: { ...base, echo: 1 },
    status: 400,
    code: "invalid_request",
    param: "echo",
  },
  {
    name: '"true" is not a boolean',
    rest: { ...base, stream: "true" },
    status: 400,
    code: "invalid_request",
    param: "stream",
  },
  {
    name: "1.5 is not an integer",
    rest: { ...base, max_tokens: 1.5 },
    status: 400,
    code: "invalid_request",
    param: "max_tokens",
  },
  {
    name: "nested type error names the path",
    rest: { ...base, stream: true, stream_options: { include_usage: "yes" } },
    status: 400,
    code: "invalid_request",
    param: "stream_options.include_usage",
  },
  {
    name: "steering scale as a string",
    rest: {
      ...base,
      max_tokens: 2,
      apply_steering_vectors: [
        { activations: [[...Array(hidden).fill(0.5)]], layer_indices: [1], scale: "2" },
      ],
    },
    status: 400,
    code: "invalid_request",
    param: "apply_steering_vectors[0].scale",
  },
  {
    name: "priority out of int32",
    rest: { ...base, priority: 2 ** 31 },
    status: 400,
    code: "invalid_request",
    param: "priority",
  },
  {
    name: "seed beyond int64",
    rest: { ...base, seed: 9223372036854775808n },
    status: 400,
    code: "invalid_request",
    param: "seed",
  },
];

function jsonBody(rest: Record<string, unknown>): string {
  return JSON.stringify(rest, (_k, v) => (typeof v === "bigint" ? `__BIG__${v}` : v)).replace(
    /"__BIG__(-?\d+)"/g,
    "$1",
  );
}

async function postRest(
  body: string,
  headers: Record<string, string> = { "content-type": "application/json" },
) {
  const res = await checkedFetch(`${stack.url}/v1/completions`, { method: "POST", headers, body });
  const json = (await res.json()) as {
    error: { message: string; type: string; param: string | null; code: string | null };
    request_id: string;
  };
  return { res, json };
}

describe("validation: REST and Connect give identical envelopes; Inference never sees the request", () => {
  it.each(cases)("$name", async (c) => {
    const before = receivedByInference();
    const { res, json } = await postRest(jsonBody(c.rest));
    expect(res.status).toBe(c.status);
    expect(Object.keys(json.error).sort()).toEqual(["code", "message", "param", "type"]);
    expect(json.error.code).toBe(c.code);
    expect(json.error.param).toBe(c.param);
    expect(json.error.type).toBe("invalid_request_error");
    if (c.message) expect(json.error.message).toBe(c.message);
    expect(json.request_id).toBe(res.headers.get("x-request-id"));
    expect(json.request_id).toMatch(/^req_[0-9a-f]{32}$/);

    if (c.connect) {
      const request = create(CreateCompletionRequestSchema, c.connect.init);
      const call = c.connect.stream
        ? (async () => {
            for await (const _ of client.streamCompletion(request)) {
              // drain
            }
          })()
        : client.createCompletion(request);
      const err = await call.then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(err).toBeInstanceOf(ConnectError);
      const envelope = err?.findDetails(ErrorEnvelopeSchema)[0];
      expect(err?.code).toBe(c.status === 404 ? Code.NotFound : Code.InvalidArgument);
      expect(err?.rawMessage).toBe(json.error.message);
      expect({
        message: envelope?.error?.message,
        type: envelope?.error?.type,
        param: envelope?.error?.param ?? null,
        code: envelope?.error?.code,
      }).toEqual(json.error);
    }
    expect(receivedByInference()).toBe(before);
  });
});

describe("REST-only refusals", () => {
  it("refuses a body that is not application/json with 415", async () => {
    const { res, json } = await postRest(jsonBody(base), { "content-type": "text/plain" });
    expect(res.status).toBe(415);
    expect(json.error.code).toBe("unsupported_media_type");
  });

  it("refuses malformed JSON with 400", async () => {
    const { res, json } = await postRest('{"model": "tiny", "prompt": ');
    expect(res.status).toBe(400);
    expect(json.error.code).toBe("invalid_request");
  });

  it("refuses a body over 8 MiB with 413 on every route", async () => {
    const big = JSON.stringify({ ...base, user: "x".repeat(8 * 1024 * 1024 + 10) });
    for (const path of ["/v1/completions", "/v1/chat/completions", "/v1/nope"]) {
      const res = await checkedFetch(`${stack.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: big,
      });
      expect(res.status, path).toBe(413);
      const json = (await res.json()) as { error: { code: string } };
      expect(json.error.code).toBe("request_too_large");
    }
  });

  it("never lets __proto__ reach a prototype", async () => {
    const { res, json } = await postRest('{"model": "tiny", "prompt": "Hi", "__proto__": {"max_tokens": 1}}');
    expect(res.status).toBe(400);
    expect(json.error.param).toBe("__proto__");
  });

  it("takes priority as a string holding an integer", async () => {
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...base, max_tokens: 1, priority: "2" }),
    });
    expect(res.status).toBe(200);
  });

  it("refuses chat completions with the message of proto/API.md §8", async () => {
    const res = await checkedFetch(`${stack.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(res.status).toBe(400);
    const json = (await res.json()) as { error: { message: string; type: string } };
    expect(json.error).toMatchObject({
      type: "invalid_request_error",
      message:
        "This API serves Base models, which have no chat format: send POST /v1/completions with a prompt instead of POST /v1/chat/completions with messages.",
    });
  });

  it("answers unknown routes with 404 and wrong methods with 405, in the envelope", async () => {
    const notFound = await checkedFetch(`${stack.url}/v1/nope`);
    expect(notFound.status).toBe(404);
    expect(((await notFound.json()) as { error: { code: string } }).error.code).toBe("unknown_route");
    const wrong = await checkedFetch(`${stack.url}/v1/completions`);
    expect(wrong.status).toBe(405);
    const body = (await wrong.json()) as { error: { code: string }; request_id: string };
    expect(body.error.code).toBe("method_not_allowed");
    expect(body.request_id).toBe(wrong.headers.get("x-request-id"));
  });

  it("lets CORS preflights through without a key", async () => {
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "OPTIONS",
      headers: {
        origin: "http://example.test",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
      },
    });
    expect(res.status).toBeLessThan(300);
    const allowed = (res.headers.get("access-control-allow-headers") ?? "").toLowerCase();
    for (const h of ["authorization", "content-type", "x-stainless-os"]) expect(allowed).toContain(h);
  });
});
