import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyPluginAsync,
  FastifyReply,
  FastifyRequest,
} from "fastify";
import type { StreamCompletionResponse } from "../../gen/acs/v1/completions_pb.js";
import { limits } from "../config/index.js";
import { type CallRecord, decodeContentEncoding } from "../core/index.js";
import { ApiError, invalidRequest } from "../errors/index.js";
import { type CompletionsApi, modelNotFound } from "../service/index.js";
import { callRecordOf } from "../telemetry/request-telemetry.js";
import { apiDocsRoutes } from "./api-docs.js";
import { createCallContext, createShutdownLink, type ShutdownLink } from "./call-context.js";
import { decodeCompletionRequestAsync } from "./decode-completion-request.js";
import { decodeDetokenizeRequest, decodeTokenizeRequest } from "./decode-tokens-request.js";
import {
  type RenderOptions,
  renderChunk,
  renderCompletion,
  renderModel,
  renderModelList,
} from "./render-completion.js";
import { renderDetokenize, renderTokenize } from "./render-tokens.js";
import {
  apiErrorFrom,
  renderMethodNotAllowed,
  renderNotFound,
  requestIdOf,
  sendError,
} from "./send-error.js";
import { createSseWriter, type SseWriter } from "./sse-writer.js";

/** Options of the {@link restRoutes} plugin. */
export interface RestRoutesOptions {
  /** The service (the same one the Connect routes call). */
  api: CompletionsApi;
  /** Milliseconds between `: keepalive` comments of a stream (proto/API.md §5: 5000). */
  keepaliveIntervalMs: number;
  /**
   * The server's shutdown (src/server/lifecycle.ts): calls still running when it aborts end with
   * its reason (a 503 envelope, or an SSE error event). @default one aborted by fastify's preClose
   * with 503 `upstream_unavailable` (app.close() ends calls at once)
   */
  shutdown?: ShutdownLink;
  /**
   * Milliseconds a stream may wait for its caller to read (the response's write buffer full)
   * before it is ended: the connection destroyed, Inference aborted, the Hold settled.
   * @default limits.streamStallMs (60000)
   */
  streamStallMs?: number;
}

/** The message of proto/API.md §8 for `POST /v1/chat/completions`. */
export const CHAT_COMPLETIONS_MESSAGE =
  "This API serves Base models, which have no chat format: send POST /v1/completions with a prompt instead of POST /v1/chat/completions with messages.";

/** The REST routes and the methods each one takes (for 405 answers on the root). */
export const restRouteMethods: Readonly<Record<string, readonly string[]>> = {
  "/v1/completions": ["POST"],
  "/v1/chat/completions": ["POST"],
  "/v1/models": ["GET", "HEAD"],
  "/tokenize": ["POST"],
  "/detokenize": ["POST"],
  "/openapi.json": ["GET", "HEAD"],
  "/docs": ["GET", "HEAD"],
};

/**
 * The methods a REST path takes (`/v1/models/{id}` included), or undefined when the path is not a
 * REST route. A trailing query string is ignored.
 */
export function allowedMethods(url: string): readonly string[] | undefined {
  const path = url.split("?", 1)[0] ?? "";
  if (path.startsWith("/v1/models/")) return restRouteMethods["/v1/models"];
  return restRouteMethods[path];
}

/**
 * A not-found handler for the root: 405 `method_not_allowed` (with `Allow`) when the path is a
 * REST route called with another method, else 404 `unknown_route`.
 */
export function handleUnmatchedRoute(request: FastifyRequest, reply: FastifyReply): FastifyReply {
  const allowed = allowedMethods(request.url);
  if (allowed !== undefined && !allowed.includes(request.method)) {
    return renderMethodNotAllowed(request, reply, allowed);
  }
  return renderNotFound(request, reply);
}

/** The body the JSON parser kept (its bytes); none (no body, or no parser ran) → empty. */
function bodyBytes(body: unknown): Uint8Array {
  return body instanceof Uint8Array ? body : new Uint8Array(0);
}

/** `application/json`, with or without `; charset=utf-8`; anything else → 415. */
function assertJsonContentType(contentType: string | undefined): void {
  // What clients send (no allocation for it).
  if (contentType === "application/json") return;
  const [essence = "", ...parameters] = (contentType ?? "")
    .split(";")
    .map((part) => part.trim().toLowerCase());
  const charset = parameters
    .find((p) => p.startsWith("charset="))
    ?.slice("charset=".length)
    .replace(/"/g, "");
  if (
    essence !== "application/json" ||
    (charset !== undefined && charset !== "utf-8" && charset !== "utf8")
  ) {
    throw new ApiError(
      "unsupported_media_type",
      "Unsupported Content-Type: send the request body as JSON with 'Content-Type: application/json'.",
    );
  }
}

/**
 * The JSON body of a POST route, after its key was checked: `Content-Type` JSON (else 415), its
 * `Content-Encoding` decoded (the 8 MiB cap on the decoded size). The request lets go of the body.
 */
async function takeJsonBody(request: FastifyRequest): Promise<Uint8Array> {
  assertJsonContentType(request.headers["content-type"]);
  const raw = bodyBytes(request.body);
  // The request lives as long as its response (a stream's: minutes); its body is not read again.
  request.body = undefined;
  return decodeContentEncoding(raw, request.headers["content-encoding"], limits.bodyLimitBytes);
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

async function registerRoutes(app: FastifyInstance, options: RestRoutesOptions): Promise<void> {
  const { api } = options;
  const keepaliveIntervalMs = options.keepaliveIntervalMs ?? limits.keepaliveIntervalMs;
  const stallMs = options.streamStallMs ?? limits.streamStallMs;
  // Without a lifecycle: aborted when the server starts closing, so that running calls (streams
  // above all) end with a 503 envelope instead of holding fastify.close() open.
  let closing = options.shutdown;
  if (closing === undefined) {
    const controller = new AbortController();
    app.addHook("preClose", async () => {
      controller.abort(
        new ApiError("upstream_unavailable", "The server is shutting down; retry the request."),
      );
    });
    // One listener on the process-long signal for all calls (see ShutdownLink).
    closing = createShutdownLink(controller.signal);
  }
  const shutdown = closing;
  const contextOf = (request: FastifyRequest, reply: FastifyReply) =>
    createCallContext(request, reply, shutdown);

  app.addHook("onRequest", (_request, reply, done) => {
    requestIdOf(reply);
    done();
  });
  // A call cut short by the shutdown (the service throws `canceled`) answers 503, not 499, and
  // its access line and metrics say so (ShutdownLink.shown).
  app.setErrorHandler((err, request, reply) =>
    sendError(reply, shutdown.shown(err, callRecordOf(request)), requestIdOf(reply)),
  );

  // Every content type is read as bytes and checked by the route itself, after the key (a bad key
  // is 401 whatever the body): JSON only (415), decoded as strict UTF-8 (invalid bytes → 400).
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(
    "*",
    { parseAs: "buffer", bodyLimit: limits.bodyLimitBytes },
    (_request, body, done) => done(null, body),
  );

  app.post("/v1/completions", { bodyLimit: limits.bodyLimitBytes }, async (request, reply) => {
    const ctx = contextOf(request, reply);
    // A bad key is 401 before the body is even looked at (OpenAI answers 401 before 400).
    await api.authenticate(ctx);
    const body = await takeJsonBody(request);
    const { request: completionRequest, stream } = await decodeCompletionRequestAsync(body);
    const render: RenderOptions = { returnTokenIds: completionRequest.returnTokenIds === true };
    if (!stream) {
      const response = await api.createCompletion(completionRequest, ctx);
      return reply
        .type("application/json; charset=utf-8")
        .send(JSON.stringify(renderCompletion(response, render)));
    }
    let prepared: () => void = () => {};
    const checked = new Promise<"checked">((resolve) => {
      prepared = () => resolve("checked");
    });
    const chunks = api
      .streamCompletion(completionRequest, { ...ctx, onPrepared: prepared })
      [Symbol.asyncIterator]();
    // Every check of the gateway (and the Hold, and its clamp header) comes before the service
    // calls Inference: wait for that without limit, so each refusal is a real HTTP status. Then
    // wait for the first chunk — an Inference refusal, too, is then a real status — but only one
    // keepalive interval, so a call that Inference queues is never silent. After that the status
    // is 200 and a refusal is an in-band envelope event.
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
        : await waitForFirst(first, keepaliveIntervalMs);
    if (waited.kind === "failed") throw waited.error;
    // The events go straight into the response, one write each (no stream between them). fastify
    // sends nothing itself once hijacked: the head is this reply's headers (X-Request-Id, CORS, the
    // clamp header) with the SSE ones, as fastify would have written them for a stream.
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
      shutdown: shutdown.signal,
      log: request.log,
      record: ctx.record,
    }).catch((err: unknown) => request.log.error({ err }, "SSE pump failed"));
    return reply;
  });

  // vLLM's /tokenize and /detokenize: the key first (401), then the body as a completion's.
  app.post("/tokenize", { bodyLimit: limits.bodyLimitBytes }, async (request, reply) => {
    const ctx = contextOf(request, reply);
    await api.authenticate(ctx);
    const tokenizeRequest = await decodeTokenizeRequest(await takeJsonBody(request));
    const response = await api.tokenize(tokenizeRequest, ctx);
    const json = renderTokenize(response, tokenizeRequest.returnTokenStrs === true);
    return reply.type("application/json; charset=utf-8").send(JSON.stringify(json));
  });

  app.post("/detokenize", { bodyLimit: limits.bodyLimitBytes }, async (request, reply) => {
    const ctx = contextOf(request, reply);
    await api.authenticate(ctx);
    const response = await api.detokenize(await decodeDetokenizeRequest(await takeJsonBody(request)), ctx);
    return reply.type("application/json; charset=utf-8").send(JSON.stringify(renderDetokenize(response)));
  });

  app.get("/v1/models", async (request, reply) => {
    const models = await api.listModels(contextOf(request, reply));
    return reply.type("application/json; charset=utf-8").send(JSON.stringify(renderModelList(models)));
  });

  // A wildcard, so that an id with a `/` matches URL-encoded (%2F) and also as two segments.
  app.get("/v1/models/*", async (request, reply) => {
    const id = (request.params as Record<string, string | undefined>)["*"] ?? "";
    const models = await api.listModels(contextOf(request, reply));
    const model = models.data.find((m) => m.id === id || m.aliases.includes(id));
    if (model === undefined) throw modelNotFound(id);
    return reply.type("application/json; charset=utf-8").send(JSON.stringify(renderModel(model, id)));
  });

  // Chat is always refused (proto/API.md §8), whatever the body: any content type is read and ignored.
  await app.register(async (chat) => {
    chat.removeAllContentTypeParsers();
    chat.addContentTypeParser(
      "*",
      { parseAs: "buffer", bodyLimit: limits.bodyLimitBytes },
      (_request, _body, done) => done(null, undefined),
    );
    chat.post("/v1/chat/completions", { bodyLimit: limits.bodyLimitBytes }, async () => {
      throw invalidRequest(null, CHAT_COMPLETIONS_MESSAGE);
    });
  });

  // GET /openapi.json and the API reference at GET /docs.
  await app.register(apiDocsRoutes);
}

/**
 * The OpenAI-compatible REST surface as an encapsulated fastify plugin (register it as a sibling
 * of the Connect plugin): `POST /v1/completions` (JSON, or SSE with `stream: true`),
 * `GET /v1/models`, `GET /v1/models/{id}` (id or alias; `/` URL-encoded or not), vLLM's
 * `POST /tokenize` and `POST /detokenize`,
 * `POST /v1/chat/completions` (always 400), and `GET /openapi.json` and `GET /docs` (the OpenAPI
 * document and its rendering: src/rest/api-docs.ts). In its scope: an `X-Request-Id` on every response,
 * bodies up to 8 MiB (413 above) — decoded when they carry `Content-Encoding: gzip`, `deflate` or
 * `br`, the 8 MiB then applying to the decoded body (415 for another coding) —, JSON only (415
 * otherwise), and every error rendered as the proto/API.md §7 envelope by {@link sendError}.
 */
export const restRoutes: FastifyPluginAsync<RestRoutesOptions> = registerRoutes;
