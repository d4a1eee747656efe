import { Pool } from "undici";
import { ApiError, randomHex32 } from "../../errors/index.js";
import { claimUpstreamRequestId, releaseUpstreamRequestId } from "../../telemetry/upstream-request-ids.js";
import { type VllmRequestBody, vllmRequestBody } from "./build-vllm-request.js";
import { createTokenizeCache, type TokenizeCache } from "./create-tokenize-cache.js";
import { decodeSse } from "./decode-sse.js";
import { isVllmErrorBody, mapUpstreamError } from "./map-upstream-error.js";
import {
  parseVllmCompletion,
  parseVllmCompletionChunk,
  parseVllmJson,
  parseVllmModelList,
  parseVllmTokenizeResponse,
} from "./parse-vllm-response.js";
import type { VllmCompletion, VllmCompletionChunk, VllmCompletionRequest, VllmModelList } from "./types.js";

/** Options of {@link createVllmClient}. Times in milliseconds. */
export interface VllmClientOptions {
  /** Inference's root URL, without `/v1` (e.g. `http://10.0.0.5:8000`); a path prefix is kept. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>` (vLLM `--api-key`). */
  apiKey?: string;
  /**
   * Most connections to this server for completions, i.e. concurrent completions (an HTTP/1.1
   * stream holds one connection): set it to what Inference accepts, so that the queue is
   * Inference's and not a hidden one here. @default {@link DEFAULT_MAX_CONCURRENT_COMPLETIONS}
   */
  connections?: number;
  /**
   * Connections kept apart for the control calls (`/tokenize`, `/v1/models`, `/health`), so that
   * they never queue behind completions. @default 16
   */
  controlConnections?: number;
  /** Longest wait for a control call's whole answer (`/tokenize`, `/v1/models`), then 504. @default 30_000 */
  controlDeadlineMs?: number;
  /**
   * Longest wait for response headers. Must exceed the 14-minute non-stream deadline (undici's
   * default of 300 s would cut it short). @default 900_000 (15 min)
   */
  headersTimeoutMs?: number;
  /** Longest silence between two body reads (streams included). @default 900_000 (15 min) */
  bodyTimeoutMs?: number;
  /** Longest TCP connect. @default 10_000 */
  connectTimeoutMs?: number;
  /** Bounds of the `/tokenize` LRU cache. @default 4096 entries, 64 MiB */
  tokenizeCacheEntries?: number;
  tokenizeCacheBytes?: number;
  /**
   * A `/tokenize` cache shared with other clients (the replicas of one model tokenize alike);
   * the two bounds above are then unused. @default a cache of this client's own
   */
  tokenizeCache?: TokenizeCache;
  /** Longest SSE event from Inference, in characters. @default 4 MiB */
  maxSseEventChars?: number;
}

/** One upstream call as a tracer sees it (the replica pool starts one per attempt). */
export interface UpstreamCallInfo {
  /** The model's id (src/config). */
  readonly model: string;
  /** The replica's base URL. */
  readonly replica: string;
  /** The `X-Request-Id` the call is sent with (before the client makes it unique, see VLLM.md). */
  readonly upstreamRequestId: string;
  /** 0 for the first replica tried, 1 for the failover. */
  readonly attempt: number;
  /** `POST /v1/completions` streamed (true) or not. */
  readonly stream: boolean;
}

/** A traced upstream call: the headers to send with it (`traceparent`, `tracestate`), and its end. */
export interface UpstreamCallTrace {
  readonly headers: Readonly<Record<string, string>>;
  /** Called once when the call ends: without an error when it succeeded. */
  end(error?: unknown): void;
}

/** Starts tracing one upstream call (src/telemetry); the replica pool calls it per attempt. */
export type UpstreamTracer = (call: UpstreamCallInfo) => UpstreamCallTrace;

/** Per-call options of {@link VllmClient.complete}. */
export interface CompleteOptions {
  /**
   * Aborted when the caller goes away: the upstream request is aborted, ApiError `canceled` (or
   * the signal's reason when it is a `deadline_exceeded` ApiError: the caller's deadline).
   */
  signal: AbortSignal;
  /** Milliseconds to wait for the whole response: then the upstream request is aborted, 504. */
  deadlineMs: number;
  /**
   * Sent as `X-Request-Id` (vllm-lens keys its state by it): an id already used by a live request
   * of this process is sent as `<id>-2`, `<id>-3`… instead (see claimUpstreamRequestId).
   */
  upstreamRequestId: string;
  /** More headers for Inference (a `traceparent`). */
  headers?: Readonly<Record<string, string>>;
  /** Traces each upstream call (the replica pool uses it; a lone client ignores it). */
  trace?: UpstreamTracer;
}

/** Per-call options of {@link VllmClient.stream}. */
export interface StreamOptions {
  /**
   * Aborted when the caller goes away: the upstream request is aborted, ApiError `canceled` (or
   * the signal's reason when it is a `deadline_exceeded` ApiError: the caller's deadline).
   */
  signal: AbortSignal;
  /** Sent as `X-Request-Id`, made unique among live requests like {@link CompleteOptions.upstreamRequestId}. */
  upstreamRequestId: string;
  /** More headers for Inference (a `traceparent`). */
  headers?: Readonly<Record<string, string>>;
  /** Traces each upstream call (the replica pool uses it; a lone client ignores it). */
  trace?: UpstreamTracer;
}

/** The result of {@link VllmClient.tokenize}. */
export interface TokenizeResult {
  /** Number of tokens (BOS included when add_special_tokens). */
  count: number;
  tokens: number[];
  /** The model's longest prompt + completion, in tokens. */
  maxModelLen: number;
}

/** The client of one Inference server (vLLM + vllm-lens). Every failure is an ApiError. */
export interface VllmClient {
  /**
   * `POST /v1/completions` without streaming (`body.stream` must be false). Throws ApiError:
   * `canceled` (signal), 504 `deadline_exceeded` (deadline or headers/body timeout; the upstream
   * request is aborted), 503/502/4xx per {@link mapUpstreamError}, 502 for a malformed body.
   */
  complete(body: VllmCompletionRequest, options: CompleteOptions): Promise<VllmCompletion>;
  /**
   * `POST /v1/completions` with streaming (`body.stream` must be true): the chunks until
   * `data: [DONE]`. Throws ApiError: an in-band error event → its mapped error; a stream that ends
   * without `[DONE]`, is reset, or carries garbage → 502 `upstream_error`; `canceled` on the signal.
   * Stopping early (break, return, throw in the loop) aborts the upstream request at once.
   */
  stream(body: VllmCompletionRequest, options: StreamOptions): AsyncIterable<VllmCompletionChunk>;
  /**
   * `POST /tokenize` (`{model, prompt, add_special_tokens}`), cached (LRU) by
   * (model, addSpecialTokens, prompt). `model` is the served model name.
   */
  tokenize(
    model: string,
    prompt: string,
    addSpecialTokens: boolean,
    signal?: AbortSignal,
  ): Promise<TokenizeResult>;
  /** `GET /v1/models`. */
  listModels(signal?: AbortSignal): Promise<VllmModelList>;
  /** `GET /health` answered 200 within 5 s and before `signal` aborts (never throws). */
  health(signal?: AbortSignal): Promise<boolean>;
  /** Closes the pool once in-flight requests have finished. */
  close(): Promise<void>;
}

/**
 * Default of {@link VllmClientOptions.connections}: concurrent completions per Inference server,
 * high enough for 10,000 concurrent streams (undici's own default of 128 was a hidden queue).
 */
export const DEFAULT_MAX_CONCURRENT_COMPLETIONS = 16_384;

/** Most bytes read after `data: [DONE]` to let the connection be reused (the chunked terminator). */
const MAX_BYTES_AFTER_DONE = 64 * 1024;

/** A fresh upstream request id: 32 lowercase hex (vLLM answers with id `cmpl-<it>`). */
export function newUpstreamRequestId(): string {
  return randomHex32();
}

const canceled = (): ApiError => new ApiError("canceled", "The request was canceled.");

/**
 * Why the caller's signal aborted, as the error the call ends with: the signal's own reason when
 * it is a `deadline_exceeded` ApiError (a deadline the caller set, e.g. Connect-Timeout-Ms), else
 * `canceled`.
 */
const callerAbort = (signal: AbortSignal): ApiError =>
  signal.reason instanceof ApiError && signal.reason.code === "deadline_exceeded"
    ? signal.reason
    : canceled();

interface CallSpec {
  /** The pool the call goes through (completions, or control calls). */
  pool: Pool;
  method: "GET" | "POST";
  path: string;
  /** A small JSON body, or a completion's (streamed when it holds tensors). */
  body?: string | VllmRequestBody;
  accept: string;
  signal: AbortSignal | undefined;
  deadlineMs?: number;
  requestId: string;
  /** More headers (a `traceparent`). */
  headers?: Readonly<Record<string, string>> | undefined;
}

/**
 * The links waiting on each caller signal, behind one `abort` listener per signal however many
 * calls share it: a request tokenizes its prompts concurrently under one signal, and an
 * EventTarget with more than 10 listeners prints MaxListenersExceededWarning.
 */
const followers = new WeakMap<AbortSignal, { links: Set<() => void>; fire: () => void }>();

/** Runs `onAbort` when `signal` aborts; returns the function that stops following it. */
function follow(signal: AbortSignal, onAbort: () => void): () => void {
  let entry = followers.get(signal);
  if (entry === undefined) {
    const links = new Set<() => void>();
    const fire = (): void => {
      followers.delete(signal);
      for (const link of links) link();
    };
    signal.addEventListener("abort", fire, { once: true });
    entry = { links, fire };
    followers.set(signal, entry);
  }
  const { links, fire } = entry;
  links.add(onAbort);
  return () => {
    links.delete(onAbort);
    if (links.size === 0 && followers.get(signal) === entry) {
      followers.delete(signal);
      signal.removeEventListener("abort", fire);
    }
  };
}

/** Ties a caller signal and an optional deadline to one AbortController; aborts carry ApiErrors. */
function linkAbort(signal: AbortSignal | undefined, deadlineMs?: number) {
  const controller = new AbortController();
  if (signal?.aborted) throw callerAbort(signal);
  const unfollow =
    signal === undefined ? undefined : follow(signal, () => controller.abort(callerAbort(signal)));
  const timer =
    deadlineMs === undefined
      ? undefined
      : setTimeout(
          () =>
            controller.abort(
              new ApiError("deadline_exceeded", `Inference did not answer within ${deadlineMs} ms.`),
            ),
          deadlineMs,
        );
  return {
    signal: controller.signal,
    abort: (): void => controller.abort(canceled()),
    /** The ApiError we aborted with, if any. */
    reason: (): ApiError | undefined =>
      controller.signal.aborted && controller.signal.reason instanceof ApiError
        ? controller.signal.reason
        : undefined,
    dispose: (): void => {
      if (timer !== undefined) clearTimeout(timer);
      unfollow?.();
    },
  };
}

function parseJson(text: string, what: string): unknown {
  try {
    return parseVllmJson(text);
  } catch (cause) {
    throw new ApiError("upstream_error", `Inference sent a ${what} that is not JSON.`, { cause });
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

  const headersFor = (spec: {
    accept: string;
    requestId: string;
    /** A JSON body's length in bytes; undefined without a body. */
    contentLength?: number | undefined;
    headers?: Readonly<Record<string, string>> | undefined;
  }): Record<string, string> => {
    const h: Record<string, string> = {
      ...spec.headers,
      accept: spec.accept,
      "x-request-id": spec.requestId,
    };
    if (spec.contentLength !== undefined) {
      h["content-type"] = "application/json";
      // Needed for a streamed body (undici would send it chunked); undici checks it either way.
      h["content-length"] = String(spec.contentLength);
    }
    if (opts.apiKey !== undefined) h.authorization = `Bearer ${opts.apiKey}`;
    return h;
  };

  /** One request whose whole JSON body is read; error bodies (any status) are mapped. */
  async function callJson(spec: CallSpec): Promise<unknown> {
    const link = linkAbort(spec.signal, spec.deadlineMs);
    const requestId = claimUpstreamRequestId(spec.requestId);
    let responseStarted = false;
    const payload: VllmRequestBody | undefined =
      typeof spec.body === "string"
        ? { body: spec.body, contentLength: Buffer.byteLength(spec.body) }
        : spec.body;
    try {
      const res = await spec.pool.request({
        method: spec.method,
        path: prefix + spec.path,
        headers: headersFor({
          accept: spec.accept,
          requestId,
          contentLength: payload?.contentLength,
          headers: spec.headers,
        }),
        ...(payload === undefined ? {} : { body: payload.body }),
        signal: link.signal,
      });
      responseStarted = true;
      const text = await res.body.text();
      if (res.statusCode < 200 || res.statusCode > 299) {
        throw mapUpstreamError({ kind: "response", status: res.statusCode, body: text });
      }
      const json = parseJson(text, "response");
      if (isVllmErrorBody(json))
        throw mapUpstreamError({ kind: "response", status: res.statusCode, body: text });
      return json;
    } catch (error) {
      throw link.reason() ?? mapUpstreamError({ kind: "transport", error, responseStarted });
    } finally {
      releaseUpstreamRequestId(requestId);
      link.dispose();
    }
  }

  async function* streamChunks(
    body: VllmCompletionRequest,
    o: StreamOptions,
  ): AsyncGenerator<VllmCompletionChunk> {
    if (!body.stream) throw new RangeError("stream() needs a body with stream: true");
    const link = linkAbort(o.signal);
    const requestId = claimUpstreamRequestId(o.upstreamRequestId);
    let responseStarted = false;
    let finished = false;
    try {
      const payload = vllmRequestBody(body);
      const res = await pool.request({
        method: "POST",
        path: `${prefix}/v1/completions`,
        headers: headersFor({
          accept: "text/event-stream",
          requestId,
          contentLength: payload.contentLength,
          headers: o.headers,
        }),
        body: payload.body,
        signal: link.signal,
      });
      responseStarted = true;
      const contentType = String(res.headers["content-type"] ?? "");
      if (res.statusCode !== 200 || !contentType.startsWith("text/event-stream")) {
        const text = await res.body.text();
        finished = true;
        if (res.statusCode !== 200 || isVllmErrorBody(parseJson(text, "response"))) {
          throw mapUpstreamError({ kind: "response", status: res.statusCode, body: text });
        }
        throw new ApiError(
          "upstream_error",
          `Inference answered a stream request with ${contentType || "no content type"}.`,
        );
      }
      let done = false;
      // The body is not destroyed when the loop stops at [DONE]: it is read to its end below.
      for await (const data of decodeSse(
        res.body.iterator({ destroyOnReturn: false }),
        maxSseEventChars === undefined ? {} : { maxEventChars: maxSseEventChars },
      )) {
        if (data === "[DONE]") {
          done = true;
          break;
        }
        const json = parseJson(data, "stream event");
        if (isVllmErrorBody(json)) throw mapUpstreamError({ kind: "event", body: json });
        yield parseVllmCompletionChunk(json);
      }
      if (!done) throw new ApiError("upstream_error", "Inference's stream ended without [DONE].");
      finished = true;
      // What follows [DONE] (the chunked terminator, often a write of its own) is read, so the
      // connection goes back to the pool instead of being closed; more than a little is dropped.
      await res.body.dump({ limit: MAX_BYTES_AFTER_DONE }).catch(() => undefined);
    } catch (error) {
      throw link.reason() ?? mapUpstreamError({ kind: "transport", error, responseStarted });
    } finally {
      // Early stop by the consumer, or an error: abort the upstream request (undici destroys the
      // socket, vLLM sees the disconnect and aborts the engine request).
      if (!finished) link.abort();
      releaseUpstreamRequestId(requestId);
      link.dispose();
    }
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
      return streamChunks(body, o);
    },

    async tokenize(model, prompt, addSpecialTokens, signal) {
      const hit = cache.get(model, addSpecialTokens, prompt);
      if (hit !== undefined)
        return { count: hit.tokens.length, tokens: [...hit.tokens], maxModelLen: hit.maxModelLen };
      const json = await callJson({
        pool: control,
        method: "POST",
        path: "/tokenize",
        body: JSON.stringify({ model, prompt, add_special_tokens: addSpecialTokens }),
        accept: "application/json",
        signal,
        deadlineMs: controlDeadlineMs,
        requestId: newUpstreamRequestId(),
      });
      const r = parseVllmTokenizeResponse(json);
      cache.set(model, addSpecialTokens, prompt, { tokens: r.tokens, maxModelLen: r.max_model_len });
      return { count: r.count, tokens: [...r.tokens], maxModelLen: r.max_model_len };
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
