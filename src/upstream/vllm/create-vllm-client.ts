import { Pool } from "undici";
import { vllmRequestBody } from "./build-vllm-request.js";
import { createTokenizeCache } from "./create-tokenize-cache.js";
import { newUpstreamRequestId } from "./ids.js";
import { type CallSpec, JsonCall } from "./json-call.js";
import {
  parseVllmCompletion,
  parseVllmDetokenizeResponse,
  parseVllmModelList,
  parseVllmTokenizeResponse,
} from "./parse-vllm-response.js";
import { upstreamHeaders } from "./upstream-call.js";
import { UpstreamStream } from "./upstream-stream.js";
import type { VllmClient, VllmClientOptions } from "./vllm-client-types.js";

/**
 * Default of {@link VllmClientOptions.connections}: concurrent completions per Inference server,
 * high enough for 10,000 concurrent streams (undici's own default of 128 was a hidden queue).
 */
export const DEFAULT_MAX_CONCURRENT_COMPLETIONS = 16_384;

/**
 * A client of one Inference server over two undici `Pool`s (keep-alive, explicit timeouts longer
 * than the 14-minute non-stream wait): one for completions, as many connections as Inference
 * accepts; one for the control calls, which therefore never wait behind completions. A streamed
 * body is read to its end after `[DONE]`, so its connection is reused. Nothing here reads the
 * environment.
 */
export function createVllmClient(opts: VllmClientOptions): VllmClient {
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
  const firstEventTimeoutMs = opts.firstEventTimeoutMs ?? 0;

  const headersFor = upstreamHeaders(opts);

  /** One request whose whole JSON body is read; error bodies (any status) are mapped. */
  function callJson(spec: CallSpec): Promise<unknown> {
    return new JsonCall(spec, prefix, headersFor).promise;
  }

  /** A control call (`/tokenize`, `/detokenize`): a small JSON body POSTed under the control deadline. */
  function postControl(
    path: string,
    body: string,
    signal: AbortSignal | undefined,
    requestId: string,
  ): Promise<unknown> {
    return callJson({
      pool: control,
      method: "POST",
      path,
      body,
      accept: "application/json",
      signal,
      deadlineMs: controlDeadlineMs,
      requestId,
    });
  }

  return {
    async complete(body, o) {
      if (body.stream) throw new RangeError("complete() needs a body with stream: false");
      const json = await callJson({
        pool,
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
        pool,
        `${prefix}/v1/completions`,
        body,
        o,
        headersFor,
        maxSseEventChars === undefined ? undefined : { maxEventChars: maxSseEventChars },
        firstEventTimeoutMs,
      );
    },

    async tokenize(model, prompt, addSpecialTokens, signal) {
      const hit = cache.get(model, addSpecialTokens, prompt);
      if (hit !== undefined)
        return { count: hit.tokens.length, tokens: [...hit.tokens], maxModelLen: hit.maxModelLen };
      const json = await postControl(
        "/tokenize",
        JSON.stringify({ model, prompt, add_special_tokens: addSpecialTokens }),
        signal,
        newUpstreamRequestId(),
      );
      const r = parseVllmTokenizeResponse(json);
      cache.set(model, addSpecialTokens, prompt, { tokens: r.tokens, maxModelLen: r.max_model_len });
      return { count: r.count, tokens: [...r.tokens], maxModelLen: r.max_model_len };
    },

    async tokenizeText(body, o) {
      const json = await postControl("/tokenize", JSON.stringify(body), o.signal, o.upstreamRequestId);
      return parseVllmTokenizeResponse(json);
    },

    async detokenize(body, o) {
      const json = await postControl("/detokenize", JSON.stringify(body), o.signal, o.upstreamRequestId);
      return parseVllmDetokenizeResponse(json);
    },

    async listModels(signal) {
      const json = await callJson({
        pool: control,
        method: "GET",
        path: "/v1/models",
        accept: "application/json",
        signal,
        deadlineMs: controlDeadlineMs,
        requestId: newUpstreamRequestId(),
      });
      return parseVllmModelList(json);
    },

    async health(signal) {
      const timeout = AbortSignal.timeout(5_000);
      try {
        const res = await control.request({
          method: "GET",
          path: `${prefix}/health`,
          headers: headersFor({ accept: "*/*", requestId: newUpstreamRequestId() }),
          signal: signal === undefined ? timeout : AbortSignal.any([timeout, signal]),
        });
        await res.body.dump();
        return res.statusCode === 200;
      } catch {
        return false;
      }
    },

    async close() {
      await Promise.all([pool.close(), control.close()]);
    },
  };
}
