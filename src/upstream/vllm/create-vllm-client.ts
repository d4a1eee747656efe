import type { Readable } from "node:stream";
import { type Dispatcher, Pool } from "undici";
import { ApiError } from "../../errors/index.js";
import { claimUpstreamRequestId, releaseUpstreamRequestId } from "../../telemetry/upstream-request-ids.js";
import { type VllmRequestBody, vllmRequestBody } from "./build-vllm-request.js";
import { createTokenizeCache, type TokenizeCache } from "./create-tokenize-cache.js";
import { createSseDecoder, type SseDecoder } from "./decode-sse.js";
import { newUpstreamRequestId } from "./ids.js";
import { isVllmErrorBody, mapUpstreamError, upstreamSilence } from "./map-upstream-error.js";
import {
  parseVllmCompletion,
  parseVllmCompletionChunk,
  parseVllmDetokenizeResponse,
  parseVllmJson,
  parseVllmModelList,
  parseVllmTokenizeResponse,
} from "./parse-vllm-response.js";
import type {
  VllmCompletion,
  VllmCompletionChunk,
  VllmCompletionRequest,
  VllmDetokenizeRequest,
  VllmDetokenizeResponse,
  VllmModelList,
  VllmTokenizeRequest,
  VllmTokenizeResponse,
} from "./types.js";

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
  /**
   * Longest wait for a stream's first SSE event, from its dispatch (Inference's response headers
   * alone, its SSE comments and the gateway's own keepalives to its caller do not count): then the
   * request is aborted with {@link upstreamSilence}'s 504 (fault `silent`). 0 = no bound.
   * Non-streamed calls (`complete`) are not bound by it: vLLM sends their headers only at the end.
   * @default 0
   */
  firstEventTimeoutMs?: number;
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
  /**
   * Set by a caller that passes nothing on before the stream's end (a unary call collecting it):
   * the replica pool may then fail over even after chunks were yielded, calling this first — the
   * caller drops what it collected, and the chunks that follow are the other replica's from the
   * start. A lone client ignores it.
   */
  onRestart?: () => void;
}

/** Per-call options of a caller's control call ({@link VllmClient.tokenizeText}, `detokenize`). */
export interface ControlCallOptions {
  /** Aborted when the caller goes away: the upstream request is aborted, ApiError `canceled`. */
  signal: AbortSignal;
  /** Sent as `X-Request-Id`, made unique among live requests like {@link CompleteOptions.upstreamRequestId}. */
  upstreamRequestId: string;
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
   * without `[DONE]`, is reset, or carries garbage → 502 `upstream_error`; no first event within
   * `firstEventTimeoutMs` → 504 `deadline_exceeded` (fault `silent`); `canceled` on the signal.
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
  /**
   * `POST /tokenize` as a caller asked it (the REST route and the Tokenize RPC): not cached, with
   * the caller's request id; vLLM's answer, `token_strs` included when asked for.
   */
  tokenizeText(body: VllmTokenizeRequest, options: ControlCallOptions): Promise<VllmTokenizeResponse>;
  /** `POST /detokenize` (`{model, tokens}` → `{prompt}`). */
  detokenize(body: VllmDetokenizeRequest, options: ControlCallOptions): Promise<VllmDetokenizeResponse>;
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

function parseJson(text: string, what: string): unknown {
  try {
    return parseVllmJson(text);
  } catch (cause) {
    throw new ApiError("upstream_error", `Inference sent a ${what} that is not JSON.`, { cause });
  }
}

/**
 * A JSON body as bytes of their own. undici turns a string body into `Buffer.from(string)` — for a
 * small one, a slice of Node's shared 8 KiB pool — and keeps it until the response ends: a stream
 * would pin a pool slab for minutes. A stream body passes through.
 */
function ownBytes(body: VllmRequestBody["body"], byteLength: number): Buffer | Readable {
  if (typeof body !== "string") return body;
  const bytes = Buffer.allocUnsafeSlow(byteLength);
  bytes.write(body, "utf8");
  return bytes;
}

/** Chunks queued and not yet taken by the consumer above which the socket is no longer read. */
const PAUSE_AT_QUEUED_CHUNKS = 32;

type HeadersFor = (spec: {
  accept: string;
  requestId: string;
  contentLength?: number | undefined;
  headers?: Readonly<Record<string, string>> | undefined;
}) => Record<string, string>;

/**
 * One `POST /v1/completions` stream ({@link VllmClient.stream}): an undici dispatch handler that
 * decodes the SSE body as it arrives (eventsource-parser, one parse and structural check per event)
 * into a queue, and the async iterator of that queue, with back-pressure (the socket is paused
 * while {@link PAUSE_AT_QUEUED_CHUNKS} chunks wait). One `abort` listener on the caller's signal
 * per request; the request starts at the first `next()`. After `[DONE]` the body is read to its
 * end (at most {@link MAX_BYTES_AFTER_DONE}) so the connection is reused; the iterator ends then.
 */
class UpstreamStream implements AsyncIterableIterator<VllmCompletionChunk>, Dispatcher.DispatchHandler {
  #started = false;
  /** The request ended, one way or another: the id is released and the listener removed. */
  #settled = false;
  /** The body was read to its end (or past [DONE] as far as wanted): nothing to abort. */
  #finished = false;
  #responseStarted = false;
  /** `[DONE]` was seen: what follows is read and dropped. */
  #done = false;
  #bytesAfterDone = 0;
  /** The error the iterator ends with once the queue is drained. */
  #error: ApiError | undefined;
  readonly #queue: VllmCompletionChunk[] = [];
  #head = 0;
  #resolve: ((r: IteratorResult<VllmCompletionChunk>) => void) | undefined;
  #reject: ((e: unknown) => void) | undefined;
  #controller: Dispatcher.DispatchController | undefined;
  /** Set when the upstream request must be aborted before undici gave us its controller. */
  #abortReason: ApiError | undefined;
  #requestId = "";
  #unfollow: (() => void) | undefined;
  #sse: SseDecoder | undefined;
  /** A non-SSE answer's body, collected to be mapped at its end. */
  #text: Buffer[] | undefined;
  #status = 0;
  #contentType = "";
  /** Runs until the first SSE event (or the end of a non-SSE answer's head): the silence bound. */
  #silence: NodeJS.Timeout | undefined;

  /** The request to send and its options: dropped once dispatched (a stream lives long). */
  #body: VllmCompletionRequest | undefined;
  #opts: StreamOptions | undefined;

  constructor(
    private readonly pool: Pool,
    private readonly path: string,
    body: VllmCompletionRequest,
    opts: StreamOptions,
    private readonly headersFor: HeadersFor,
    private readonly sseOptions: { maxEventChars: number } | undefined,
    private readonly firstEventTimeoutMs: number,
  ) {
    this.#body = body;
    this.#opts = opts;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  next(): Promise<IteratorResult<VllmCompletionChunk>> {
    if (!this.#started) {
      try {
        this.#start();
      } catch (error) {
        this.#settled = true; // thrown before anything was claimed or sent
        return Promise.reject(error);
      }
    }
    if (this.#head < this.#queue.length) {
      const value = this.#queue[this.#head++] as VllmCompletionChunk;
      if (this.#head === this.#queue.length) {
        this.#queue.length = 0;
        this.#head = 0;
        if (this.#controller?.paused === true && !this.#settled) this.#controller.resume();
      }
      return Promise.resolve({ value, done: false });
    }
    if (this.#error !== undefined) return Promise.reject(this.#error);
    if (this.#settled) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
  }

  /** The consumer stopped early: the upstream request is aborted (unless [DONE] was seen). */
  return(): Promise<IteratorResult<VllmCompletionChunk>> {
    if (!this.#started) {
      this.#started = true;
      this.#settled = true; // nothing was claimed or sent
    } else if (!this.#settled && !this.#done) {
      this.#fail(canceled(), true);
    }
    // Past [DONE] the rest of the body is still read (and the id released at its end), so the
    // connection is reused; what is queued is dropped either way.
    this.#queue.length = 0;
    this.#head = 0;
    this.#error = undefined;
    return Promise.resolve({ value: undefined, done: true });
  }

  #start(): void {
    this.#started = true;
    const body = this.#body as VllmCompletionRequest;
    const opts = this.#opts as StreamOptions;
    // Nothing of the request is kept once it is on its way (its JSON is undici's until sent).
    this.#body = undefined;
    this.#opts = undefined;
    if (!body.stream) throw new RangeError("stream() needs a body with stream: true");
    const signal = opts.signal;
    if (signal.aborted) throw callerAbort(signal);
    this.#requestId = claimUpstreamRequestId(opts.upstreamRequestId);
    this.#unfollow = follow(signal, () => {
      if (this.#done) {
        // The caller left during the read after [DONE]: the stream itself is complete.
        this.#controller?.abort(canceled());
        this.#finished = true;
        this.#end();
      } else this.#fail(callerAbort(signal), true);
    });
    try {
      const payload = vllmRequestBody(body);
      this.pool.dispatch(
        {
          method: "POST",
          path: this.path,
          headers: this.headersFor({
            accept: "text/event-stream",
            requestId: this.#requestId,
            contentLength: payload.contentLength,
            headers: opts.headers,
          }),
          body: ownBytes(payload.body, payload.contentLength),
        },
        this,
      );
    } catch (error) {
      this.#fail(mapUpstreamError({ kind: "transport", error, responseStarted: false }), true);
    }
  }

  /** Ends the request with `error` (after the chunks already queued); aborts upstream if asked. */
  #fail(error: ApiError, abort: boolean): void {
    if (this.#settled) return;
    this.#error = error;
    this.#settle();
    if (abort && !this.#finished) {
      if (this.#controller === undefined) this.#abortReason = error;
      else this.#controller.abort(error);
    }
    const reject = this.#reject;
    if (reject !== undefined && this.#head === this.#queue.length) {
      this.#resolve = undefined;
      this.#reject = undefined;
      reject(error);
    }
  }

  #settle(): void {
    this.#settled = true;
    this.#answerStarted();
    releaseUpstreamRequestId(this.#requestId);
    this.#unfollow?.();
    this.#unfollow = undefined;
  }

  /** The body was read to its end after [DONE]: the iterator ends after the queued chunks. */
  #end(): void {
    if (this.#settled) return;
    this.#finished = true;
    this.#settle();
    const resolve = this.#resolve;
    if (resolve !== undefined && this.#head === this.#queue.length) {
      this.#resolve = undefined;
      this.#reject = undefined;
      resolve({ value: undefined, done: true });
    }
  }

  #push(chunk: VllmCompletionChunk): void {
    const resolve = this.#resolve;
    if (resolve !== undefined) {
      this.#resolve = undefined;
      this.#reject = undefined;
      resolve({ value: chunk, done: false });
      return;
    }
    this.#queue.push(chunk);
    if (this.#queue.length - this.#head >= PAUSE_AT_QUEUED_CHUNKS) this.#controller?.pause();
  }

  /** Inference's answer started (or the request ended): the silence bound is off. */
  #answerStarted(): void {
    if (this.#silence === undefined) return;
    clearTimeout(this.#silence);
    this.#silence = undefined;
  }

  readonly #onData = (data: string): void => {
    if (this.#done || this.#settled) return;
    this.#answerStarted();
    if (data === "[DONE]") {
      this.#done = true;
      return;
    }
    try {
      const json = parseJson(data, "stream event");
      if (isVllmErrorBody(json)) throw mapUpstreamError({ kind: "event", body: json });
      this.#push(parseVllmCompletionChunk(json));
    } catch (error) {
      this.#fail(
        error instanceof ApiError
          ? error
          : mapUpstreamError({ kind: "transport", error, responseStarted: true }),
        true,
      );
    }
  };

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#abortReason !== undefined) controller.abort(this.#abortReason);
    // From the request's start on a connection: a wait in this client's own queue is not silence.
    const silentMs = this.firstEventTimeoutMs;
    if (silentMs > 0 && !this.#settled && this.#silence === undefined)
      this.#silence = setTimeout(() => this.#fail(upstreamSilence(silentMs), true), silentMs);
  }

  onResponseStart(
    controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: Record<string, string | string[] | undefined>,
  ): void {
    this.#controller = controller;
    this.#responseStarted = true;
    // undici's controller keeps the raw head (Buffers that pin the socket's read buffer) for as
    // long as the stream lives; only the parsed `headers` are read, here.
    if ("rawHeaders" in controller) controller.rawHeaders = null;
    const contentType = headers["content-type"];
    this.#contentType = contentType === undefined ? "" : String(contentType);
    this.#status = statusCode;
    if (statusCode !== 200 || !this.#contentType.startsWith("text/event-stream")) {
      // An error answer (a body read to its end, under the body timeout), not a silence.
      this.#answerStarted();
      this.#text = [];
    } else this.#sse = createSseDecoder(this.#onData, this.sseOptions);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#text !== undefined) {
      this.#text.push(chunk);
      return;
    }
    if (this.#settled && !this.#done) return;
    if (this.#done) {
      this.#bytesAfterDone += chunk.length;
      // More than a little after [DONE]: dropped with the connection.
      if (this.#bytesAfterDone > MAX_BYTES_AFTER_DONE) {
        this.#finished = true;
        controller.abort(canceled());
        this.#end();
      }
      return;
    }
    const sse = this.#sse as SseDecoder;
    sse.push(chunk);
    const failure = sse.failure();
    if (failure !== undefined) this.#fail(failure, true);
  }

  onResponseEnd(): void {
    if (this.#text !== undefined) {
      this.#finished = true;
      const bytes = Buffer.concat(this.#text);
      // As undici's body.text(): UTF-8, a BOM skipped.
      const bom = bytes.length > 2 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
      const text = bytes.toString("utf8", bom ? 3 : 0);
      this.#text = undefined;
      let error: ApiError;
      try {
        if (this.#status !== 200 || isVllmErrorBody(parseJson(text, "response"))) {
          error = mapUpstreamError({ kind: "response", status: this.#status, body: text });
        } else {
          error = new ApiError(
            "upstream_error",
            `Inference answered a stream request with ${this.#contentType || "no content type"}.`,
          );
        }
      } catch (e) {
        error =
          e instanceof ApiError
            ? e
            : mapUpstreamError({ kind: "transport", error: e, responseStarted: true });
      }
      this.#fail(error, false);
      return;
    }
    if (!this.#done && !this.#settled) {
      const sse = this.#sse as SseDecoder;
      sse.end();
      const failure = sse.failure();
      if (failure !== undefined) this.#fail(failure, false);
      else if (!this.#done)
        this.#fail(new ApiError("upstream_error", "Inference's stream ended without [DONE]."), false);
    }
    this.#finished = true;
    this.#end();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    if (this.#done) {
      // After [DONE] a failure to read the rest only costs the connection.
      this.#finished = true;
      this.#end();
      return;
    }
    this.#finished = true;
    this.#fail(mapUpstreamError({ kind: "transport", error, responseStarted: this.#responseStarted }), false);
  }
}

/**
 * One upstream request whose whole JSON answer is read ({@link VllmClient.complete}, `/tokenize`,
 * `/v1/models`): an undici dispatch handler that collects the body's bytes and settles `promise`
 * with the parsed JSON at its end — no Readable, no AbortController: one `abort` listener on the
 * caller's signal (shared, {@link follow}) and one timer for the deadline. Rejects with an ApiError:
 * the caller's abort (`canceled`, or its `deadline_exceeded`), `deadline_exceeded` after
 * `deadlineMs`, Inference's error answer (any status; an error body with 200 too) mapped by
 * {@link mapUpstreamError}, `upstream_error` for a body that is not JSON, or the transport's fault.
 */
class JsonCall implements Dispatcher.DispatchHandler {
  readonly promise: Promise<unknown>;
  #resolve!: (json: unknown) => void;
  #reject!: (error: unknown) => void;
  #settled = false;
  #responseStarted = false;
  #status = 0;
  #chunks: Buffer[] = [];
  #controller: Dispatcher.DispatchController | undefined;
  /** Why we abort the request (set before undici gave us its controller, or when we abort). */
  #abortReason: ApiError | undefined;
  #requestId = "";
  #unfollow: (() => void) | undefined;
  #timer: NodeJS.Timeout | undefined;

  constructor(spec: CallSpec, prefix: string, headersFor: HeadersFor) {
    this.promise = new Promise((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    const signal = spec.signal;
    if (signal?.aborted) {
      this.#settled = true;
      this.#reject(callerAbort(signal));
      return;
    }
    this.#requestId = claimUpstreamRequestId(spec.requestId);
    if (signal !== undefined) this.#unfollow = follow(signal, () => this.#abort(callerAbort(signal)));
    const deadlineMs = spec.deadlineMs;
    if (deadlineMs !== undefined) {
      this.#timer = setTimeout(
        () =>
          this.#abort(new ApiError("deadline_exceeded", `Inference did not answer within ${deadlineMs} ms.`)),
        deadlineMs,
      );
    }
    const payload: VllmRequestBody | undefined =
      typeof spec.body === "string"
        ? { body: spec.body, contentLength: Buffer.byteLength(spec.body) }
        : spec.body;
    try {
      spec.pool.dispatch(
        {
          method: spec.method,
          path: prefix + spec.path,
          headers: headersFor({
            accept: spec.accept,
            requestId: this.#requestId,
            contentLength: payload?.contentLength,
            headers: spec.headers,
          }),
          ...(payload === undefined ? {} : { body: payload.body }),
        },
        this,
      );
    } catch (error) {
      this.#fail(mapUpstreamError({ kind: "transport", error, responseStarted: false }));
    }
  }

  /** Ends the call with `error` and aborts the request (the caller left, or the deadline passed). */
  #abort(error: ApiError): void {
    if (this.#settled) return;
    this.#abortReason = error;
    this.#fail(error);
    this.#controller?.abort(error);
  }

  #fail(error: unknown): void {
    if (this.#settled) return;
    this.#end();
    this.#reject(error);
  }

  #end(): void {
    this.#settled = true;
    this.#chunks = [];
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#unfollow?.();
    this.#unfollow = undefined;
    releaseUpstreamRequestId(this.#requestId);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#abortReason !== undefined) controller.abort(this.#abortReason);
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number): void {
    this.#controller = controller;
    this.#responseStarted = true;
    this.#status = statusCode;
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (!this.#settled) this.#chunks.push(chunk);
  }

  onResponseEnd(): void {
    if (this.#settled) return;
    const bytes = this.#chunks.length === 1 ? (this.#chunks[0] as Buffer) : Buffer.concat(this.#chunks);
    // As undici's body.text(): UTF-8, a BOM skipped.
    const bom = bytes.length > 2 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
    const text = bytes.toString("utf8", bom ? 3 : 0);
    const status = this.#status;
    try {
      if (status < 200 || status > 299) throw mapUpstreamError({ kind: "response", status, body: text });
      const json = parseJson(text, "response");
      if (isVllmErrorBody(json)) throw mapUpstreamError({ kind: "response", status, body: text });
      this.#end();
      this.#resolve(json);
    } catch (error) {
      this.#fail(error);
    }
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.#fail(
      this.#abortReason ??
        mapUpstreamError({ kind: "transport", error, responseStarted: this.#responseStarted }),
    );
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
  const firstEventTimeoutMs = opts.firstEventTimeoutMs ?? 0;

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
