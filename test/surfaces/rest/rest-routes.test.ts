import { once } from "node:events";
import { request as httpRequest, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import Fastify, { type FastifyInstance } from "fastify";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import { limits } from "../../../src/config/index.js";
import { ApiError, isRequestId } from "../../../src/core/errors/index.js";
import { createModelRegistry, modelNotFound } from "../../../src/service/index.js";
import {
  CHAT_COMPLETIONS_MESSAGE,
  handleUnmatchedRoute,
  restRoutes,
} from "../../../src/surfaces/rest/rest-routes.js";
import { requestTooLarge } from "../../../src/surfaces/rest/send-error.js";
import { configDefaults } from "../../helpers/config-defaults.js";
import { until } from "../../helpers/hang-guard.js";
import { parseSse, withoutKeepalives } from "../../helpers/parse-sse.js";
import { createFakeApi, type FakeApiOptions, headJson, lateRefusal } from "./helpers/fake-api.js";

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

async function build(keepaliveIntervalMs = configDefaults.keepaliveIntervalMs, options: FakeApiOptions = {}) {
  const fake = createFakeApi(options);
  app = Fastify();
  await app.register(restRoutes, {
    api: fake.api,
    keepaliveIntervalMs,
    streamStallMs: configDefaults.streamStallMs,
  });
  app.setNotFoundHandler(handleUnmatchedRoute);
  await app.ready();
  return { app, ...fake };
}

const json = { "content-type": "application/json" };

/**
 * Streams a `model` ("queued" or "keepalive") request over a real socket with the fake service's
 * `gate` shut, opening it once `keepalives` keepalive comments have reached the client (keepalives
 * counted, not milliseconds slept). Returns the response and its whole body.
 */
async function streamWhileHeld(model: string, keepalives: number): Promise<{ res: Response; text: string }> {
  let open = () => {};
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  const built = await build(20, { gate });
  await built.app.listen({ port: 0, host: "127.0.0.1" });
  const { port } = built.app.server.address() as AddressInfo;
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: "POST",
    headers: json,
    body: completion({ model, stream: true }),
  });
  let text = "";
  const decoder = new TextDecoder();
  for await (const part of res.body!) {
    text += decoder.decode(part, { stream: true });
    if (text.split(": keepalive\n\n").length > keepalives) open();
  }
  return { res, text };
}
const completion = (fields: Record<string, unknown>) =>
  JSON.stringify({ model: "llama-8b", prompt: "The sky is", ...fields });

describe("POST /v1/completions (JSON)", () => {
  it("answers the rendered completion with X-Request-Id, and hands the service the call context", async () => {
    const { app, calls } = await build();
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: { ...json, authorization: "Bearer sk-test" },
      payload: completion({ max_tokens: 2 }),
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toBe("application/json; charset=utf-8");
    const requestId = res.headers["x-request-id"];
    expect(typeof requestId === "string" && isRequestId(requestId)).toBe(true);
    expect(res.json()).toStrictEqual({
      ...headJson,
      model: "llama-8b",
      choices: [
        {
          index: 0,
          text: " blue.",
          logprobs: null,
          finish_reason: "stop",
          stop_reason: "\n",
          token_ids: null,
          prompt_logprobs: null,
          prompt_token_ids: null,
        },
      ],
      service_tier: null,
      system_fingerprint: null,
      usage: { prompt_tokens: 4, total_tokens: 6, completion_tokens: 2, prompt_tokens_details: null },
      kv_transfer_params: null,
    });
    expect(calls).toHaveLength(1);
    const [call] = calls;
    expect(call?.method).toBe("createCompletion");
    expect(call?.request?.maxTokens).toBe(2);
    expect(call?.ctx.requestId).toBe(requestId);
    expect(call?.ctx.authorization).toBe("Bearer sk-test");
    expect(call?.ctx.signal.aborted).toBe(false);
  });

  it("keeps a 19-digit seed exact on its way to the service", async () => {
    const { app, calls } = await build();
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: '{"model": "llama-8b", "prompt": "x", "seed": 9223372036854775807}',
    });
    expect(res.statusCode).toBe(200);
    expect(calls[0]?.request?.seed).toBe(9223372036854775807n);
  });

  it("sends headers the service sets (X-Acs-Max-Tokens-Clamped)", async () => {
    const { app } = await build();
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "clamp" }),
    });
    expect(res.headers["x-acs-max-tokens-clamped"]).toBe("7");
  });

  it.each(["application/json; charset=utf-8", "application/json;charset=UTF-8", "Application/JSON"])(
    "takes Content-Type %s",
    async (contentType) => {
      const { app } = await build();
      const res = await app.inject({
        method: "POST",
        url: "/v1/completions",
        headers: { "content-type": contentType },
        payload: completion({}),
      });
      expect(res.statusCode).toBe(200);
    },
  );
});

const eightMiB = 8 * 1024 * 1024;

interface RefusalCase {
  name: string;
  method?: "POST" | "GET";
  url?: string;
  headers?: Record<string, string>;
  payload?: string | Buffer;
  status: number;
  type: string;
  code: string;
  param: string | null;
  message?: string;
}

const refusals: RefusalCase[] = [
  {
    name: "max_tokens as a string (the seed's example)",
    headers: json,
    payload: completion({ max_tokens: "2" }),
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: "max_tokens",
    message: "Invalid type for 'max_tokens': expected a number.",
  },
  {
    name: "unknown field best_of",
    headers: json,
    payload: completion({ best_of: 2 }),
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: "best_of",
    message: "Unrecognized request argument supplied: best_of",
  },
  {
    name: "malformed JSON",
    headers: json,
    payload: '{"model": ',
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: null,
  },
  {
    name: "empty JSON body",
    headers: json,
    payload: "",
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: null,
  },
  {
    name: "text/plain",
    headers: { "content-type": "text/plain" },
    payload: completion({}),
    status: 415,
    type: "invalid_request_error",
    code: "unsupported_media_type",
    param: null,
  },
  {
    name: "form body",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    payload: "model=x",
    status: 415,
    type: "invalid_request_error",
    code: "unsupported_media_type",
    param: null,
  },
  {
    name: "no Content-Type, no body",
    status: 415,
    type: "invalid_request_error",
    code: "unsupported_media_type",
    param: null,
  },
  {
    name: "JSON in another charset",
    headers: { "content-type": "application/json; charset=latin1" },
    payload: completion({}),
    status: 415,
    type: "invalid_request_error",
    code: "unsupported_media_type",
    param: null,
  },
  {
    name: "body over 8 MiB",
    headers: json,
    payload: completion({ user: "x".repeat(eightMiB) }),
    status: 413,
    type: "invalid_request_error",
    code: "request_too_large",
    param: null,
    message: "The request body is too large: at most 8388608 bytes (8 MiB).",
  },
  {
    name: "invalid UTF-8 inside a string",
    headers: json,
    payload: Buffer.concat([
      Buffer.from('{"model": "llama-8b", "prompt": "a'),
      Buffer.from([0xff, 0xfe]),
      Buffer.from('"}'),
    ]),
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: null,
  },
  {
    name: "a leading UTF-8 BOM",
    headers: json,
    payload: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(completion({}))]),
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: null,
  },
  {
    name: "output_residual_stream false",
    headers: json,
    payload: completion({ output_residual_stream: false }),
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: "output_residual_stream",
    message: "Invalid type for 'output_residual_stream': expected an array of integers or true.",
  },
  {
    name: "unknown model (the service's ApiError)",
    headers: json,
    payload: completion({ model: "missing" }),
    status: 404,
    type: "invalid_request_error",
    code: "model_not_found",
    param: "model",
    message: "The model `missing` does not exist or you do not have access to it.",
  },
  {
    name: "a refusal of a stream is a real HTTP status",
    headers: json,
    payload: completion({ model: "missing", stream: true }),
    status: 404,
    type: "invalid_request_error",
    code: "model_not_found",
    param: "model",
  },
  {
    name: "an unexpected error is a 500 without its details",
    headers: json,
    payload: completion({ model: "boom" }),
    status: 500,
    type: "server_error",
    code: "internal_error",
    param: null,
    message: "The server had an error while processing your request.",
  },
  {
    name: "chat completions with messages",
    url: "/v1/chat/completions",
    headers: json,
    payload: JSON.stringify({ model: "llama-8b", messages: [{ role: "user", content: "hi" }] }),
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: null,
    message: CHAT_COMPLETIONS_MESSAGE,
  },
  {
    name: "chat completions with any body",
    url: "/v1/chat/completions",
    headers: { "content-type": "text/plain" },
    payload: "hello",
    status: 400,
    type: "invalid_request_error",
    code: "invalid_request",
    param: null,
    message: CHAT_COMPLETIONS_MESSAGE,
  },
  {
    name: "chat completions over 8 MiB",
    url: "/v1/chat/completions",
    headers: json,
    payload: "x".repeat(eightMiB + 1),
    status: 413,
    type: "invalid_request_error",
    code: "request_too_large",
    param: null,
    message: "The request body is too large: at most 8388608 bytes (8 MiB).",
  },
  {
    name: "unknown model id",
    method: "GET",
    url: "/v1/models/nope",
    status: 404,
    type: "invalid_request_error",
    code: "model_not_found",
    param: "model",
    message: "The model `nope` does not exist or you do not have access to it.",
  },
  {
    name: "unknown route",
    method: "GET",
    url: "/v1/nope?x=1",
    status: 404,
    type: "invalid_request_error",
    code: "unknown_route",
    param: null,
    message: "Invalid URL (GET /v1/nope)",
  },
  {
    name: "wrong method on a REST route",
    method: "GET",
    url: "/v1/completions",
    status: 405,
    type: "invalid_request_error",
    code: "method_not_allowed",
    param: null,
    message: "Method GET is not allowed on /v1/completions; use POST.",
  },
];

describe("refusals: the §7 envelope with the right status, and X-Request-Id = request_id", () => {
  it.each(refusals)("$name → $status $code", async (c) => {
    const { app } = await build();
    const res = await app.inject({
      method: c.method ?? "POST",
      url: c.url ?? "/v1/completions",
      ...(c.headers === undefined ? {} : { headers: c.headers }),
      ...(c.payload === undefined ? {} : { payload: c.payload }),
    });
    expect(res.statusCode).toBe(c.status);
    expect(res.headers["content-type"]).toBe("application/json; charset=utf-8");
    const body = res.json() as { error: Record<string, unknown>; request_id: string };
    expect(Object.keys(body).sort()).toEqual(["error", "request_id"]);
    expect(Object.keys(body.error).sort()).toEqual(["code", "message", "param", "type"]);
    expect({ type: body.error.type, code: body.error.code, param: body.error.param }).toEqual({
      type: c.type,
      code: c.code,
      param: c.param,
    });
    expect(typeof body.error.message).toBe("string");
    if (c.message !== undefined) expect(body.error.message).toBe(c.message);
    expect(isRequestId(body.request_id)).toBe(true);
    expect(res.headers["x-request-id"]).toBe(body.request_id);
  });

  it("takes a body of exactly 8 MiB", async () => {
    const { app } = await build();
    const empty = completion({ user: "" });
    const payload = completion({ user: "x".repeat(eightMiB - Buffer.byteLength(empty)) });
    expect(Buffer.byteLength(payload)).toBe(eightMiB);
    const res = await app.inject({ method: "POST", url: "/v1/completions", headers: json, payload });
    expect(res.statusCode).toBe(200);
  });

  it("405 names the allowed methods in Allow", async () => {
    const { app } = await build();
    const res = await app.inject({ method: "DELETE", url: "/v1/models/llama-8b" });
    expect([res.statusCode, res.headers.allow]).toEqual([405, "GET, HEAD"]);
  });
});

describe("authentication comes before the body (OpenAI answers 401 before 400)", () => {
  const refuseKey = () => {
    throw new ApiError("invalid_api_key", "Incorrect API key provided.");
  };

  it.each([
    { name: "a type error", payload: completion({ max_tokens: "2" }) },
    { name: "an unknown field", payload: completion({ best_of: 2 }) },
    { name: "malformed JSON", payload: '{"model": ' },
    { name: "a stream with a type error", payload: completion({ stream: true, n: "x" }) },
  ])("a bad key with $name in the body → 401 invalid_api_key", async ({ payload }) => {
    const { app, calls } = await build(5000, { authenticate: refuseKey });
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: { ...json, authorization: "Bearer sk-wrong" },
      payload,
    });
    expect(res.statusCode).toBe(401);
    const body = res.json() as { error: Record<string, unknown>; request_id: string };
    expect(body.error).toMatchObject({ code: "invalid_api_key", param: null });
    expect(body.request_id).toBe(res.headers["x-request-id"]);
    expect(calls).toEqual([]);
  });

  it("a bad key with a wrong Content-Type → 401 too", async () => {
    const { app } = await build(5000, { authenticate: refuseKey });
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: { "content-type": "text/plain" },
      payload: "hello",
    });
    expect(res.statusCode).toBe(401);
  });

  it("authenticates with the call's context, then decodes: a good key with a type error → 400", async () => {
    const { app, authenticated } = await build();
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: { ...json, authorization: "Bearer sk-good" },
      payload: completion({ max_tokens: "2" }),
    });
    expect(res.statusCode).toBe(400);
    expect(authenticated.map((ctx) => [ctx.authorization, ctx.requestId])).toEqual([
      ["Bearer sk-good", res.headers["x-request-id"]],
    ]);
  });
});

describe("shared messages", () => {
  it("requestTooLarge(limit) is the 413 of every REST body over the limit", () => {
    const error = requestTooLarge(limits.bodyLimitBytes);
    expect([error.status, error.code, error.param, error.message]).toEqual([
      413,
      "request_too_large",
      null,
      "The request body is too large: at most 8388608 bytes (8 MiB).",
    ]);
    expect(requestTooLarge(1000).message).toBe("The request body is too large: at most 1000 bytes.");
  });

  it("GET /v1/models/{id} refuses an unknown id with the service's model_not_found, word for word", async () => {
    const registry = createModelRegistry(
      [
        {
          id: "meta-llama/Llama-3.1-8B",
          aliases: ["llama-8b"],
          upstreams: [{ url: "http://127.0.0.1:1", apiKey: undefined, weight: 1 }],
          servedModelName: "meta-llama/Llama-3.1-8B",
          maxModelLen: 131072,
          hiddenSize: 4096,
          numLayers: 32,
          ownedBy: "acs",
        },
      ],
      () => ({ serving: () => true }),
    );
    const fromService = (() => {
      try {
        registry.resolve("no/such-model");
      } catch (err) {
        return err as ApiError;
      }
      throw new Error("resolve() found no/such-model");
    })();
    const { app } = await build();
    const res = await app.inject({ method: "GET", url: "/v1/models/no%2Fsuch-model" });
    expect(res.statusCode).toBe(404);
    const { error } = res.json() as { error: Record<string, unknown> };
    expect(error).toEqual({
      message: fromService.message,
      type: "invalid_request_error",
      param: fromService.param,
      code: fromService.code,
    });
    const shared = modelNotFound("no/such-model");
    expect([shared.message, shared.param, shared.code]).toEqual([
      fromService.message,
      fromService.param,
      fromService.code,
    ]);
  });
});

describe("GET /v1/models", () => {
  const model = {
    id: "meta-llama/Llama-3.1-8B",
    object: "model",
    created: 1_720_000_000,
    owned_by: "acs",
    root: "meta-llama/Llama-3.1-8B",
    max_model_len: 131072,
    aliases: ["llama-8b"],
    hidden_size: 4096,
    num_hidden_layers: 32,
  };

  it("lists the served models", async () => {
    const { app } = await build();
    const res = await app.inject({ method: "GET", url: "/v1/models" });
    expect(res.statusCode).toBe(200);
    expect(isRequestId(String(res.headers["x-request-id"]))).toBe(true);
    expect(res.json()).toEqual({ object: "list", data: [model, { ...model, id: "llama-8b" }] });
  });

  it.each([
    "/v1/models/meta-llama%2FLlama-3.1-8B",
    "/v1/models/meta-llama/Llama-3.1-8B",
    "/v1/models/llama-8b",
  ])("finds one model by id or alias, named as asked: %s", async (url) => {
    const { app } = await build();
    const res = await app.inject({ method: "GET", url });
    const name = url.endsWith("llama-8b") ? "llama-8b" : "meta-llama/Llama-3.1-8B";
    expect([res.statusCode, res.json()]).toEqual([200, { ...model, id: name }]);
  });
});

describe("POST /v1/completions with stream: true (SSE)", () => {
  it("streams the chunks, the usage chunk and [DONE], as text/event-stream", async () => {
    const { app } = await build();
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "clamp", stream: true, stream_options: { include_usage: true } }),
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toBe("text/event-stream; charset=utf-8");
    expect(res.headers["x-acs-max-tokens-clamped"]).toBe("7");
    expect(isRequestId(String(res.headers["x-request-id"]))).toBe(true);
    const chunkHead = { ...headJson, model: "clamp" };
    expect(withoutKeepalives(parseSse(res.body))).toStrictEqual([
      {
        kind: "data",
        data: {
          ...chunkHead,
          choices: [
            {
              index: 0,
              text: " blue",
              logprobs: null,
              finish_reason: null,
              stop_reason: null,
              prompt_token_ids: null,
              token_ids: null,
            },
          ],
          usage: null,
        },
      },
      {
        kind: "data",
        data: {
          ...chunkHead,
          choices: [
            {
              index: 0,
              text: ".",
              logprobs: null,
              finish_reason: "length",
              stop_reason: null,
              prompt_token_ids: null,
              token_ids: null,
            },
          ],
          usage: null,
        },
      },
      {
        kind: "data",
        data: {
          ...chunkHead,
          choices: [],
          usage: { prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 },
        },
      },
      { kind: "done" },
    ]);
  });

  it("an error after the first chunk is one envelope event with the request id, then [DONE]", async () => {
    const { app, events } = await build();
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "fail-mid", stream: true }),
    });
    expect(res.statusCode).toBe(200);
    const blocks = withoutKeepalives(parseSse(res.body));
    expect(blocks.slice(1)).toEqual([
      {
        kind: "data",
        data: {
          error: {
            message: "Inference failed mid-stream.",
            type: "server_error",
            param: null,
            code: "upstream_error",
          },
          request_id: res.headers["x-request-id"],
        },
      },
      { kind: "done" },
    ]);
    expect(events).toEqual(["finally"]);
  });

  it("carries : keepalive comments while the service is quiet", async () => {
    const { text } = await streamWhileHeld("keepalive", 2);
    const blocks = parseSse(text);
    const firstData = blocks.findIndex((b) => b.kind === "data");
    const comments = blocks.filter((b) => b.kind === "comment");
    expect(firstData).toBe(0);
    expect(comments.length).toBeGreaterThanOrEqual(2);
    expect(withoutKeepalives(blocks).map((b) => b.kind)).toEqual(["data", "data", "done"]);
  });
});

describe("a stream whose first chunk is slow", () => {
  it("checks that outlast the keepalive interval still refuse with a real status", async () => {
    const { app } = await build(20, { firstChunkDelayMs: 150 });
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "slow-check", stream: true }),
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ error: { code: "invalid_request", param: "max_tokens" } });
  });

  it("a clamp decided after the keepalive interval still reaches the response headers", async () => {
    const { app } = await build(20, { firstChunkDelayMs: 150 });
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "slow-clamp", stream: true }),
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers["x-acs-max-tokens-clamped"]).toBe("3");
  });

  it("gets the 200 head and keepalives after one interval, then its chunks", async () => {
    const { res, text } = await streamWhileHeld("queued", 2);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    const blocks = parseSse(text);
    const firstData = blocks.findIndex((b) => b.kind === "data");
    expect(firstData).toBeGreaterThanOrEqual(2);
    expect(blocks.slice(0, firstData)).toEqual(
      Array.from({ length: firstData }, () => ({ kind: "comment", text: "keepalive" })),
    );
    expect(withoutKeepalives(blocks).map((b) => b.kind)).toEqual(["data", "data", "done"]);
  });

  it("sends bytes on a real socket before the first chunk comes", async () => {
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const { app } = await build(20, { gate });
    await app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = app.server.address() as AddressInfo;
    const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: "POST",
      headers: json,
      body: completion({ model: "queued", stream: true }),
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    // the service holds its first chunk until this client has read bytes: they were flushed without it
    const part = await reader.read();
    release();
    expect(new TextDecoder().decode(part.value)).toMatch(/^(: keepalive\n\n)+$/);
    let text = new TextDecoder().decode(part.value);
    for (let next = await reader.read(); !next.done; next = await reader.read())
      text += new TextDecoder().decode(next.value);
    expect(withoutKeepalives(parseSse(text)).map((b) => b.kind)).toEqual(["data", "data", "done"]);
  });

  it("a refusal within the interval is still a real HTTP status", async () => {
    const { app } = await build(200, { firstChunkDelayMs: 10 });
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "late-refusal", stream: true }),
    });
    expect(res.statusCode).toBe(400);
    expect(res.headers["content-type"]).toBe("application/json; charset=utf-8");
    expect(res.json()).toEqual({
      error: {
        message: lateRefusal().message,
        type: "invalid_request_error",
        param: "max_tokens",
        code: "invalid_request",
      },
      request_id: res.headers["x-request-id"],
    });
  });

  it("a refusal after the interval is the in-band envelope event and [DONE] (the status is sent)", async () => {
    const { app, events } = await build(20, { firstChunkDelayMs: 100 });
    const res = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: json,
      payload: completion({ model: "late-refusal", stream: true }),
    });
    expect(res.statusCode).toBe(200);
    const blocks = parseSse(res.body);
    expect(blocks[0]).toEqual({ kind: "comment", text: "keepalive" });
    expect(withoutKeepalives(blocks)).toEqual([
      {
        kind: "data",
        data: {
          error: {
            message: lateRefusal().message,
            type: "invalid_request_error",
            param: "max_tokens",
            code: "invalid_request",
          },
          request_id: res.headers["x-request-id"],
        },
      },
      { kind: "done" },
    ]);
    expect(events).toEqual(["finally"]);
  });
});

describe("on a real socket", () => {
  async function listen() {
    const built = await build();
    await built.app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = built.app.server.address() as AddressInfo;
    return { ...built, port };
  }

  it("a client that disconnects mid-stream aborts the call's signal and closes the iterator", async () => {
    const { port, calls, events } = await listen();
    const req = httpRequest({
      host: "127.0.0.1",
      port,
      method: "POST",
      path: "/v1/completions",
      headers: json,
    });
    req.end(completion({ model: "slow", stream: true }));
    const [res] = (await once(req, "response")) as [IncomingMessage];
    expect(res.statusCode).toBe(200);
    await once(res, "data");
    req.destroy();
    // the `slow` stream waits for its signal however long it takes: only the disconnect ends it
    await until(() => events.includes("finally"), "the stream's iterator closed");
    expect(events).toEqual(["aborted", "finally"]);
    expect(calls[0]?.ctx.signal.aborted).toBe(true);
  });

  it("closing the server ends a running stream with a 503 envelope event and [DONE]", async () => {
    const { app, port, events } = await listen();
    const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: "POST",
      headers: json,
      body: completion({ model: "slow", stream: true }),
    });
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = decoder.decode((await reader.read()).value);
    const closed = app.close();
    for (let part = await reader.read(); !part.done; part = await reader.read())
      text += decoder.decode(part.value);
    await closed;
    expect(events).toEqual(["aborted", "finally"]);
    expect(withoutKeepalives(parseSse(text)).slice(1)).toEqual([
      {
        kind: "data",
        data: {
          error: {
            message: "The server is shutting down; retry the request.",
            type: "server_error",
            param: null,
            code: "upstream_unavailable",
          },
          request_id: res.headers.get("x-request-id"),
        },
      },
      { kind: "done" },
    ]);
  });

  it("a finished response does not abort the signal", async () => {
    const { port, calls } = await listen();
    const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: "POST",
      headers: json,
      body: completion({}),
    });
    expect(res.status).toBe(200);
    await res.json();
    await sleep(20);
    expect(calls[0]?.ctx.signal.aborted).toBe(false);
  });

  it("the openai SDK (6.x) parses completions, streams and errors", async () => {
    const { port } = await listen();
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "sk-test", maxRetries: 0 });

    const completionRes = await client.completions.create({
      model: "llama-8b",
      prompt: "The sky is",
      max_tokens: 2,
    });
    expect(completionRes.choices.map((c) => [c.index, c.text, c.finish_reason])).toEqual([
      [0, " blue.", "stop"],
    ]);
    expect(completionRes.usage?.total_tokens).toBe(6);

    const stream = await client.completions.create({
      model: "llama-8b",
      prompt: "The sky is",
      stream: true,
      stream_options: { include_usage: true },
    });
    const texts: string[] = [];
    let usage: unknown;
    for await (const chunk of stream) {
      for (const c of chunk.choices) texts.push(c.text);
      if (chunk.usage) usage = chunk.usage;
    }
    expect(texts).toEqual([" blue", "."]);
    expect(usage).toEqual({ prompt_tokens: 4, completion_tokens: 2, total_tokens: 6 });

    const refused = await client.completions
      .create({
        model: "llama-8b",
        prompt: "x",
        best_of: 2,
      } as unknown as OpenAI.CompletionCreateParamsNonStreaming)
      .catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
    const apiError = refused as InstanceType<typeof OpenAI.BadRequestError>;
    expect([apiError.status, apiError.code, apiError.param, apiError.type]).toEqual([
      400,
      "invalid_request",
      "best_of",
      "invalid_request_error",
    ]);
    expect(isRequestId(apiError.requestID ?? "")).toBe(true);

    const midStream = await client.completions.create({ model: "fail-mid", prompt: "x", stream: true });
    const seen: string[] = [];
    const streamError = await (async () => {
      for await (const chunk of midStream) seen.push(chunk.choices[0]?.text ?? "");
    })().catch((err: unknown) => err);
    expect(seen).toEqual([" blue"]);
    expect(streamError).toBeInstanceOf(OpenAI.APIError);
    expect((streamError as InstanceType<typeof OpenAI.APIError>).code).toBe("upstream_error");
  });
});
