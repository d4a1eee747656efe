import type { Dispatcher, Pool } from "undici";
import { ApiError } from "../../core/errors/index.js";
import { claimUpstreamRequestId, releaseUpstreamRequestId } from "../../core/index.js";
import { vllmRequestBody } from "./build-vllm-request.js";
import { createSseDecoder, type SseDecoder } from "./decode-sse.js";
import { isVllmErrorBody, mapUpstreamError, upstreamSilence } from "./map-upstream-error.js";
import { parseVllmCompletionChunk } from "./parse-vllm-response.js";
import type { VllmCompletionChunk, VllmCompletionRequest } from "./types.js";
import {
  bodyText,
  callerAbort,
  canceled,
  follow,
  type HeadersFor,
  ownBytes,
  parseJson,
} from "./upstream-call.js";
import type { StreamOptions } from "./vllm-client-types.js";

/** Most bytes read after `data: [DONE]` to let the connection be reused (the chunked terminator). */
const MAX_BYTES_AFTER_DONE = 64 * 1024;

/** Chunks queued and not yet taken by the consumer above which the socket is no longer read. */
const PAUSE_AT_QUEUED_CHUNKS = 32;

/**
 * One `POST /v1/completions` stream ({@link VllmClient.stream}): an undici dispatch handler that
 * decodes the SSE body as it arrives (eventsource-parser, one parse and structural check per event)
 * into a queue, and the async iterator of that queue, with back-pressure (the socket is paused
 * while {@link PAUSE_AT_QUEUED_CHUNKS} chunks wait). One `abort` listener on the caller's signal
 * per request; the request starts at the first `next()`. After `[DONE]` the body is read to its
 * end (at most {@link MAX_BYTES_AFTER_DONE}) so the connection is reused; the iterator ends then.
 */
export class UpstreamStream
  implements AsyncIterableIterator<VllmCompletionChunk>, Dispatcher.DispatchHandler
{
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
  /**
   * The silence bound (`silenceTimeoutMs`): runs from the request's start to `[DONE]` (or the
   * head of a non-SSE answer), and fails the stream when no SSE event came for that long — before
   * the first one or between two — while the socket was read (not while back-pressure paused it).
   */
  #silence: NodeJS.Timeout | undefined;
  /** When the last SSE event came (or the request started, or reading resumed), ms since the epoch. */
  #lastEventAt = 0;

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
    private readonly silenceTimeoutMs: number,
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
        if (this.#controller?.paused === true && !this.#settled) {
          this.#lastEventAt = Date.now(); // a pause of ours is not the upstream's silence
          this.#controller.resume();
        }
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
    this.#stopSilence();
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

  /** `[DONE]`, a non-SSE answer's head or the request's end: the silence bound is off. */
  #stopSilence(): void {
    if (this.#silence === undefined) return;
    clearTimeout(this.#silence);
    this.#silence = undefined;
  }

  /** The silence bound's timer: fails the stream if it was quiet that long, else waits the rest. */
  readonly #onSilence = (): void => {
    this.#silence = undefined;
    if (this.#settled || this.#done) return;
    const silentMs = this.silenceTimeoutMs;
    if (this.#controller?.paused === true) this.#lastEventAt = Date.now();
    const quiet = Date.now() - this.#lastEventAt;
    if (quiet >= silentMs) this.#fail(upstreamSilence(silentMs), true);
    else this.#silence = setTimeout(this.#onSilence, silentMs - quiet);
  };

  readonly #onData = (data: string): void => {
    if (this.#done || this.#settled) return;
    this.#lastEventAt = Date.now();
    if (data === "[DONE]") {
      this.#done = true;
      this.#stopSilence();
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
    const silentMs = this.silenceTimeoutMs;
    if (silentMs > 0 && !this.#settled && this.#silence === undefined) {
      this.#lastEventAt = Date.now();
      this.#silence = setTimeout(this.#onSilence, silentMs);
    }
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
      this.#stopSilence();
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
      const text = bodyText(this.#text);
      this.#text = undefined;
      this.#fail(notAStream(this.#status, this.#contentType, text), false);
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
 * The error a stream request ends with when Inference answered it with something other than an
 * event stream (`text`, the whole body): Inference's error (any status; an error body with 200
 * too) mapped, else `upstream_error` naming the content type it sent.
 */
function notAStream(status: number, contentType: string, text: string): ApiError {
  try {
    if (status !== 200 || isVllmErrorBody(parseJson(text, "response"))) {
      return mapUpstreamError({ kind: "response", status, body: text });
    }
    return new ApiError(
      "upstream_error",
      `Inference answered a stream request with ${contentType || "no content type"}.`,
    );
  } catch (e) {
    return e instanceof ApiError
      ? e
      : mapUpstreamError({ kind: "transport", error: e, responseStarted: true });
  }
}
