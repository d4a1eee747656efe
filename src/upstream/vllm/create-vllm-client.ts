import { Pool } from "undici";
import { vllmRequestBody } from "./build-vllm-request.js";
import { createTokenizeCache, type TokenizeCache } from "./create-tokenize-cache.js";
import { newUpstreamRequestId } from "./ids.js";
import { type CallSpec, JsonCall } from "./json-call.js";
import {
  parseVllmCompletion,
  parseVllmDetokenizeResponse,
  parseVllmModelList,
  parseVllmTokenizeResponse,
} from "./parse-vllm-response.js";
import { type HeadersFor, upstreamHeaders } from "./upstream-call.js";
import { UpstreamStream } from "./upstream-stream.js";
import type { TokenizeResult, VllmClient, VllmClientOptions } from "./vllm-client-types.js";

/**
 * Default of {@link VllmClientOptions.connections}: concurrent completions per Inference server,
 * high enough for 10,000 concurrent streams (undici's own default of 128 was a hidden queue).
 */
export const DEFAULT_MAX_CONCURRENT_COMPLETIONS = 16_384;

/** One client's state: its two pools, its path prefix, its cache and settings. */
interface ClientState {
  /** The Inference URL's path, without a trailing `/` (prefixed to every path). */
  readonly prefix: string;
  /** Completions. */
  readonly pool: Pool;
  /** The control calls (`/tokenize`, `/detokenize`, `/v1/models`, `/health`). */
  readonly control: Pool;
  readonly controlDeadlineMs: number;
  readonly cache: TokenizeCache;
  readonly maxSseEventChars: number | undefined;
  readonly silenceTimeoutMs: number;
  readonly headersFor: HeadersFor;
}

function clientState(opts: VllmClientOptions): ClientState {
  const url = new URL(opts.baseUrl);
  const prefix = url.pathname.replace(/\/+$/, "");
  const timeouts = {
    headersTimeout: opts.headersTimeoutMs ?? 900_000,
    bodyTimeout: opts.bodyTimeoutMs ?? 900_000,
    connectTimeout: opts.connectTimeoutMs ?? 10_000,
  };
  const pool = new Pool(url.origin, {
    connections: opts.connections ?? DEFAULT_MAX_CONCURRENT_COMPLETIONS,
    ...timeouts,
  });
  const control = new Pool(url.origin, { connections: opts.controlConnections ?? 16, ...timeouts });
  const controlDeadlineMs = opts.controlDeadlineMs ?? 30_000;
  const cache =
    opts.tokenizeCache ??
    createTokenizeCache({
      ...(opts.tokenizeCacheEntries === undefined ? {} : { maxEntries: opts.tokenizeCacheEntries }),
      ...(opts.tokenizeCacheBytes === undefined ? {} : { maxBytes: opts.tokenizeCacheBytes }),
    });
  const maxSseEventChars = opts.maxSseEventChars;
  const silenceTimeoutMs = opts.silenceTimeoutMs;
  const headersFor = upstreamHeaders(opts);
  return {
    prefix,
    pool,
    control,
    controlDeadlineMs,
    cache,
    maxSseEventChars,
    silenceTimeoutMs,
    headersFor,
  };
}

/** One request whose whole JSON body is read; error bodies (any status) are mapped. */
function callJson(c: ClientState, spec: CallSpec): Promise<unknown> {
  return new JsonCall(spec, c.prefix, c.headersFor).promise;
}

/** A control call (`/tokenize`, `/detokenize`): a small JSON body POSTed under the control deadline. */
function postControl(
  c: ClientState,
  path: string,
  body: string,
  signal: AbortSignal | undefined,
  requestId: string,
): Promise<unknown> {
  return callJson(c, {
    pool: c.control,
    method: "POST",
    path,
    body,
    accept: "application/json",
    signal,
    deadlineMs: c.controlDeadlineMs,
    requestId,
  });
}

/** {@link VllmClient.tokenize}: from the cache, else `POST /tokenize` (then cached). */
async function tokenizeCached(
  c: ClientState,
  model: string,
  prompt: string,
  addSpecialTokens: boolean,
  signal: AbortSignal | undefined,
): Promise<TokenizeResult> {
  const hit = c.cache.get(model, addSpecialTokens, prompt);
  if (hit !== undefined)
    return { count: hit.tokens.length, tokens: [...hit.tokens], maxModelLen: hit.maxModelLen };
  const json = await postControl(
    c,
    "/tokenize",
    JSON.stringify({ model, prompt, add_special_tokens: addSpecialTokens }),
    signal,
    newUpstreamRequestId(),
  );
  const r = parseVllmTokenizeResponse(json);
  c.cache.set(model, addSpecialTokens, prompt, { tokens: r.tokens, maxModelLen: r.max_model_len });
  return { count: r.count, tokens: [...r.tokens], maxModelLen: r.max_model_len };
}

/** {@link VllmClient.health}: `GET /health` answered 200 within 5 s and before `signal` aborts. */
async function healthy(c: ClientState, signal: AbortSignal | undefined): Promise<boolean> {
  const timeout = AbortSignal.timeout(5_000);
  try {
    const res = await c.control.request({
      method: "GET",
      path: `${c.prefix}/health`,
      headers: c.headersFor({ accept: "*/*", requestId: newUpstreamRequestId() }),
      signal: signal === undefined ? timeout : AbortSignal.any([timeout, signal]),
    });
    await res.body.dump();
    return res.statusCode === 200;
  } catch {
    return false;
  }
}

/**
 * A client of one Inference server over two undici `Pool`s (keep-alive, explicit timeouts longer
 * than the 14-minute non-stream wait): one for completions, as many connections as Inference
 * accepts; one for the control calls, which therefore never wait behind completions. A streamed
 * body is read to its end after `[DONE]`, so its connection is reused. Nothing here reads the
 * environment.
 */
export function createVllmClient(opts: VllmClientOptions): VllmClient {
  const c = clientState(opts);
  return {
    async complete(body, o) {
      if (body.stream) throw new RangeError("complete() needs a body with stream: false");
      const json = await callJson(c, {
        pool: c.pool,
        method: "POST",
        path: "/v1/completions",
        body: vllmRequestBody(body),
        accept: "application/json",
        signal: o.signal,
        deadlineMs: o.deadlineMs,
        requestId: o.upstreamRequestId,
        headers: o.headers,
      });
      return parseVllmCompletion(json);
    },

    stream(body, o) {
      return new UpstreamStream(
        c.pool,
        `${c.prefix}/v1/completions`,
        body,
        o,
        c.headersFor,
        c.maxSseEventChars === undefined ? undefined : { maxEventChars: c.maxSseEventChars },
        c.silenceTimeoutMs,
      );
    },

    tokenize: (model, prompt, addSpecialTokens, signal) =>
      tokenizeCached(c, model, prompt, addSpecialTokens, signal),

    async tokenizeText(body, o) {
      const json = await postControl(c, "/tokenize", JSON.stringify(body), o.signal, o.upstreamRequestId);
      return parseVllmTokenizeResponse(json);
    },

    async detokenize(body, o) {
      const json = await postControl(c, "/detokenize", JSON.stringify(body), o.signal, o.upstreamRequestId);
      return parseVllmDetokenizeResponse(json);
    },

    async listModels(signal) {
      const json = await callJson(c, {
        pool: c.control,
        method: "GET",
        path: "/v1/models",
        accept: "application/json",
        signal,
        deadlineMs: c.controlDeadlineMs,
        requestId: newUpstreamRequestId(),
      });
      return parseVllmModelList(json);
    },

    health: (signal) => healthy(c, signal),

    async close() {
      await Promise.all([c.pool.close(), c.control.close()]);
    },
  };
}
