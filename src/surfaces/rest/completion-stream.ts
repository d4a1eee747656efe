// A REST completion's stream (`stream: true`): every check of the service awaited before the
// status is committed, the first chunk awaited for one keepalive interval, then the SSE head and
// the chunks pumped as `data:` events (proto/API.md §5).
import type { FastifyBaseLogger, FastifyReply, FastifyRequest } from "fastify";
import type {
  CreateCompletionRequest,
  StreamCompletionResponse,
} from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../core/errors/index.js";
import type { CallRecord, ShutdownLink } from "../../core/index.js";
import type { CallContext, CompletionsApi } from "../../service/index.js";
import { type RenderOptions, renderChunk } from "./render-completion.js";
import { apiErrorFrom } from "./send-error.js";
import { createSseWriter, type SseWriter } from "./sse-writer.js";

/** What a stream needs of the REST routes' scope. */
export interface StreamScope {
  readonly api: CompletionsApi;
  readonly shutdown: ShutdownLink;
  /** Milliseconds between `: keepalive` comments (and the wait for a first chunk). */
  readonly keepaliveIntervalMs: number;
  /** Milliseconds a stream may wait for its caller to read before it is ended. */
  readonly stallMs: number;
}

/** What {@link pumpChunks} keeps of a stream's first chunk once it took it: nothing. */
const TAKEN: Promise<IteratorResult<StreamCompletionResponse>> = Promise.resolve({
  value: undefined,
  done: true,
});

/**
 * Streams the chunks as SSE, starting with `first` (the pending or settled first `next()`). An
 * error (before or after the first chunk: the status is already 200) becomes one envelope event
 * and `[DONE]`; a client that goes away stops the loop and closes the iterator (which aborts
 * Inference). An error of this side (rendering a chunk) closes the iterator too, so that the
 * service settles the Hold and aborts Inference; one the iterator threw leaves it as it is (it
 * has ended). Exported for its tests.
 */
export async function pumpChunks(
  first: Promise<IteratorResult<StreamCompletionResponse>>,
  chunks: AsyncIterator<StreamCompletionResponse>,
  writer: SseWriter,
  opts: {
    render: RenderOptions;
    requestId: string;
    shutdown: AbortSignal;
    log: FastifyBaseLogger;
    /** The call's record: its `errorCode` becomes the code of the error event sent. */
    record?: CallRecord | undefined;
  },
): Promise<void> {
  let finished = false;
  try {
    // A chunk is let go once written: none is held while the next one is awaited (for a second
    // or more at Inference's pace). A chunk kept that long outlives V8's young generation and
    // piles up in the old one, as garbage only a full collection frees (~1 KiB per chunk).
    let pending: Promise<IteratorResult<StreamCompletionResponse>> | undefined = first;
    first = TAKEN;
    for (;;) {
      let next: IteratorResult<StreamCompletionResponse> | undefined;
      try {
        next = await pending;
      } catch (err) {
        finished = true; // the iterator failed: it has ended
        throw err;
      }
      pending = undefined;
      if (next.done === true) break;
      const sent = writer.send(renderChunk(next.value, opts.render));
      next = undefined;
      if (!(await sent)) return;
      pending = chunks.next();
    }
    finished = true;
    await writer.done();
  } catch (err) {
    if (!finished) {
      finished = true;
      await chunks.return?.().catch(() => undefined);
    }
    if (writer.closed) return;
    const apiError = opts.shutdown.aborted ? shutdownError(opts.shutdown) : apiErrorFrom(err);
    // The access line and the metrics say what the caller got: e.g. the shutdown's error, not the
    // `canceled` the service recorded when the shutdown aborted its call.
    if (opts.record !== undefined) opts.record.errorCode = apiError.code;
    // A bug is an error; Inference's failures are warnings; a cancel is only the access log's.
    if (apiError.code === "internal_error") opts.log.error({ err }, "stream failed after start");
    else if (apiError.status >= 500) opts.log.warn({ err }, "stream failed after start");
    await writer.fail(apiError.toEnvelope(opts.requestId));
  } finally {
    if (!finished) await chunks.return?.();
  }
}

/** What the first `next()` of a stream gave within the wait, or that it is still pending. */
type FirstChunk =
  | { readonly kind: "settled"; readonly result: IteratorResult<StreamCompletionResponse> }
  | { readonly kind: "failed"; readonly error: unknown }
  | { readonly kind: "pending" };

/** Waits for `first` at most `ms` milliseconds (the timer is cleared either way). */
async function waitForFirst(
  first: Promise<IteratorResult<StreamCompletionResponse>>,
  ms: number,
): Promise<FirstChunk> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<FirstChunk>((resolve) => {
    timer = setTimeout(() => resolve({ kind: "pending" }), ms);
  });
  try {
    return await Promise.race([
      first.then(
        (result): FirstChunk => ({ kind: "settled", result }),
        (error: unknown): FirstChunk => ({ kind: "failed", error }),
      ),
      timeout,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** The error a call gets when the server shuts down under it (the shutdown signal's reason). */
function shutdownError(shutdown: AbortSignal): ApiError {
  return shutdown.reason instanceof ApiError ? shutdown.reason : apiErrorFrom(shutdown.reason);
}

/** The service's chunks of one call, its first `next()`, and what that gave within the wait. */
interface StartedStream {
  readonly chunks: AsyncIterator<StreamCompletionResponse>;
  readonly first: Promise<IteratorResult<StreamCompletionResponse>>;
  readonly waited: FirstChunk;
}

/**
 * Starts the call. Every check of the gateway (and the Hold, and its clamp header) comes before
 * the service calls Inference: that is awaited without limit, so each refusal is a real HTTP
 * status. Then the first chunk is awaited — an Inference refusal, too, is then a real status —
 * but only one keepalive interval, so a call that Inference queues is never silent. After that
 * the status is 200 and a refusal is an in-band envelope event.
 *
 * @throws whatever the service threw before its first chunk (an ApiError refusal, mostly)
 */
async function startStream(
  scope: StreamScope,
  completionRequest: CreateCompletionRequest,
  ctx: CallContext,
): Promise<StartedStream> {
  let prepared: () => void = () => {};
  const checked = new Promise<"checked">((resolve) => {
    prepared = () => resolve("checked");
  });
  const chunks = scope.api
    .streamCompletion(completionRequest, { ...ctx, onPrepared: prepared })
    [Symbol.asyncIterator]();
  const first = chunks.next();
  const firstSettled = first.then(
    () => "first" as const,
    () => "first" as const,
  );
  const reached = await Promise.race([checked, firstSettled]);
  // The first chunk has come (or failed): take it without a timer.
  const waited =
    reached === "first"
      ? await first.then(
          (result): FirstChunk => ({ kind: "settled", result }),
          (error: unknown): FirstChunk => ({ kind: "failed", error }),
        )
      : await waitForFirst(first, scope.keepaliveIntervalMs);
  if (waited.kind === "failed") throw waited.error;
  return { chunks, first, waited };
}

/**
 * Takes the response over from fastify and writes its head: this reply's headers (X-Request-Id,
 * CORS, the clamp header) with the SSE ones, as fastify would have written them for a stream.
 * fastify sends nothing itself once hijacked; the events go straight into the response, one
 * write each (no stream between them).
 */
function writeEventStreamHead(reply: FastifyReply): void {
  reply
    .type("text/event-stream; charset=utf-8")
    .header("cache-control", "no-cache")
    .header("x-accel-buffering", "no");
  reply.hijack();
  const res = reply.raw;
  const headers = reply.getHeaders();
  const head: Record<string, string | number | string[]> = {};
  for (const name in headers) {
    const value = headers[name];
    if (value !== undefined) head[name] = value;
  }
  // The head is stored as written (sent with the first write); the response keeps no header map
  // of its own beside it, as it would after setHeader().
  res.writeHead(res.statusCode, head);
}

/**
 * Answers `POST /v1/completions` with `stream: true`: starts the call ({@link startStream}), then
 * writes the SSE head and pumps the chunks ({@link pumpChunks}) without awaiting them.
 *
 * @returns the hijacked reply, once the head is written
 * @throws ApiError (or what the service threw) before the head: fastify's error handler answers it
 */
export async function replyWithStream(
  scope: StreamScope,
  completionRequest: CreateCompletionRequest,
  ctx: CallContext,
  render: RenderOptions,
  request: FastifyRequest,
  reply: FastifyReply,
): Promise<FastifyReply> {
  const { chunks, first, waited } = await startStream(scope, completionRequest, ctx);
  writeEventStreamHead(reply);
  const res = reply.raw;
  const { keepaliveIntervalMs, stallMs } = scope;
  const writer = createSseWriter(res, {
    keepaliveIntervalMs,
    stallMs,
    // The caller has not read for stallMs: end the stream (the call's signal aborts Inference;
    // the pump stops and closes the iterator, which settles the Hold).
    onStall: () => {
      // request.log already names the request (requestId).
      request.log.info({ stallMs }, `stream ended: its caller has not read for ${stallMs} ms`);
      res.destroy();
    },
  });
  // One interval has passed with no chunk: a keepalive now puts the 200 head on the wire.
  if (waited.kind === "pending") res.write(": keepalive\n\n");
  void pumpChunks(first, chunks, writer, {
    render,
    requestId: ctx.requestId,
    shutdown: scope.shutdown.signal,
    log: request.log,
    record: ctx.record,
  }).catch((err: unknown) => request.log.error({ err }, "SSE pump failed"));
  return reply;
}
