import type { Dispatcher, Pool } from "undici";
import { type ApiError, inferenceDeadlineExceeded } from "../../core/errors/index.js";
import { claimUpstreamRequestId, releaseUpstreamRequestId } from "../../core/index.js";
import type { VllmRequestBody } from "./build-vllm-request.js";
import { isVllmErrorBody, mapUpstreamError } from "./map-upstream-error.js";
import { bodyText, callerAbort, follow, type HeadersFor, parseJson } from "./upstream-call.js";

export interface CallSpec {
  /** The pool the call goes through (completions, or control calls). */
  pool: Pool;
  method: "GET" | "POST";
  path: string;
  /** A small JSON body, or a completion's (streamed when it holds tensors). */
  body?: string | VllmRequestBody;
  accept: string;
  signal: AbortSignal | undefined;
  /** Milliseconds to wait for the whole answer; undefined: no deadline of the call's own. */
  deadlineMs?: number | undefined;
  requestId: string;
  /** More headers (a `traceparent`). */
  headers?: Readonly<Record<string, string>> | undefined;
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
export class JsonCall implements Dispatcher.DispatchHandler {
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
      this.#timer = setTimeout(() => this.#abort(inferenceDeadlineExceeded(deadlineMs)), deadlineMs);
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
    const text = bodyText(this.#chunks);
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
