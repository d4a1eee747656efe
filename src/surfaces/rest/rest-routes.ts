import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import { limits } from "../../config/index.js";
import { ApiError, invalidRequest } from "../../core/errors/index.js";
import { createShutdownLink, type ShutdownLink } from "../../core/index.js";
import { type AdminApi, type CompletionsApi, modelNotFound } from "../../service/index.js";
import { callRecordOf } from "../../telemetry/request-telemetry.js";
import { adminAllowedMethods, registerAdminRoutes } from "./admin-routes.js";
import { apiDocsRoutes } from "./api-docs.js";
import { createCallContext } from "./call-context.js";
import { replyWithStream, type StreamScope } from "./completion-stream.js";
import { decodeCompletionRequestAsync } from "./decode-completion-request.js";
import { decodeDetokenizeRequest, decodeTokenizeRequest } from "./decode-tokens-request.js";
import { takeJsonBody } from "./json-body.js";
import { type RenderOptions, renderCompletion, renderModel, renderModelList } from "./render-completion.js";
import { renderDetokenize, renderTokenize } from "./render-tokens.js";
import { renderMethodNotAllowed, renderNotFound, requestIdOf, sendError } from "./send-error.js";
import { registerUsageRoute } from "./usage-route.js";

/** Options of the {@link restRoutes} plugin. */
export interface RestRoutesOptions {
  /** The service (the same one the Connect routes call). */
  api: CompletionsApi;
  /** The admin service under /v1/admin/ (the same one the Connect routes call); absent: no admin routes. */
  admin?: AdminApi;
  /** Milliseconds between `: keepalive` comments of a stream (ACS_KEEPALIVE_MS; proto/API.md §5). */
  keepaliveIntervalMs: number;
  /**
   * The server's shutdown (src/surfaces/http/lifecycle.ts): calls still running when it aborts end with
   * its reason (a 503 envelope, or an SSE error event). @default one aborted by fastify's preClose
   * with 503 `upstream_unavailable` (app.close() ends calls at once)
   */
  shutdown?: ShutdownLink;
  /**
   * Milliseconds a stream may wait for its caller to read (the response's write buffer full)
   * before it is ended: the connection destroyed, Inference aborted, the Hold settled
   * (ACS_STREAM_STALL_MS).
   */
  streamStallMs: number;
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
  if (path.startsWith("/v1/admin/")) return adminAllowedMethods(path);
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

/** What every route of the plugin reads: the service, the shutdown and the stream's timings. */
type RestScope = StreamScope;

const JSON_TYPE = "application/json; charset=utf-8";

/**
 * The shutdown the routes' calls end with: the lifecycle's, or (without one) one aborted when the
 * server starts closing, so that running calls (streams above all) end with a 503 envelope
 * instead of holding fastify.close() open.
 */
function shutdownOf(app: FastifyInstance, options: RestRoutesOptions): ShutdownLink {
  if (options.shutdown !== undefined) return options.shutdown;
  const controller = new AbortController();
  app.addHook("preClose", async () => {
    controller.abort(new ApiError("upstream_unavailable", "The server is shutting down; retry the request."));
  });
  // One listener on the process-long signal for all calls (see ShutdownLink).
  return createShutdownLink(controller.signal);
}

/** The scope's hooks: a request id on every response, errors as the envelope, bodies as bytes. */
function installHooks(app: FastifyInstance, shutdown: ShutdownLink): void {
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
}

/** `POST /v1/completions`: the key (401 before the body is looked at), the body, then JSON or SSE. */
async function postCompletion(scope: RestScope, request: FastifyRequest, reply: FastifyReply) {
  const ctx = createCallContext(request, reply, scope.shutdown);
  // A bad key is 401 before the body is even looked at (OpenAI answers 401 before 400).
  await scope.api.authenticate(ctx);
  const body = await takeJsonBody(request);
  const { request: completionRequest, stream } = await decodeCompletionRequestAsync(body);
  const render: RenderOptions = { returnTokenIds: completionRequest.returnTokenIds === true };
  if (stream) return replyWithStream(scope, completionRequest, ctx, render, request, reply);
  const response = await scope.api.createCompletion(completionRequest, ctx);
  return reply.type(JSON_TYPE).send(JSON.stringify(renderCompletion(response, render)));
}

/** vLLM's `POST /tokenize`: the key first (401), then the body as a completion's. */
async function postTokenize(scope: RestScope, request: FastifyRequest, reply: FastifyReply) {
  const ctx = createCallContext(request, reply, scope.shutdown);
  await scope.api.authenticate(ctx);
  const tokenizeRequest = await decodeTokenizeRequest(await takeJsonBody(request));
  const response = await scope.api.tokenize(tokenizeRequest, ctx);
  const json = renderTokenize(response, tokenizeRequest.returnTokenStrs === true);
  return reply.type(JSON_TYPE).send(JSON.stringify(json));
}

/** vLLM's `POST /detokenize`: as /tokenize. */
async function postDetokenize(scope: RestScope, request: FastifyRequest, reply: FastifyReply) {
  const ctx = createCallContext(request, reply, scope.shutdown);
  await scope.api.authenticate(ctx);
  const response = await scope.api.detokenize(
    await decodeDetokenizeRequest(await takeJsonBody(request)),
    ctx,
  );
  return reply.type(JSON_TYPE).send(JSON.stringify(renderDetokenize(response)));
}

/** `GET /v1/models`. */
async function getModels(scope: RestScope, request: FastifyRequest, reply: FastifyReply) {
  const models = await scope.api.listModels(createCallContext(request, reply, scope.shutdown));
  return reply.type(JSON_TYPE).send(JSON.stringify(renderModelList(models)));
}

/** `GET /v1/models/{id}`: by id or alias, named as asked; unknown → 404 `model_not_found`. */
async function getModel(scope: RestScope, request: FastifyRequest, reply: FastifyReply) {
  const id = (request.params as Record<string, string | undefined>)["*"] ?? "";
  const models = await scope.api.listModels(createCallContext(request, reply, scope.shutdown));
  const model = models.data.find((m) => m.id === id || m.aliases.includes(id));
  if (model === undefined) throw modelNotFound(id);
  return reply.type(JSON_TYPE).send(JSON.stringify(renderModel(model, id)));
}

/** Chat is always refused (proto/API.md §8), whatever the body: any content type is read and ignored. */
async function chatRoutes(chat: FastifyInstance): Promise<void> {
  chat.removeAllContentTypeParsers();
  chat.addContentTypeParser(
    "*",
    { parseAs: "buffer", bodyLimit: limits.bodyLimitBytes },
    (_request, _body, done) => done(null, undefined),
  );
  chat.post("/v1/chat/completions", { bodyLimit: limits.bodyLimitBytes }, async () => {
    throw invalidRequest(null, CHAT_COMPLETIONS_MESSAGE);
  });
}

async function registerRoutes(app: FastifyInstance, options: RestRoutesOptions): Promise<void> {
  const scope: RestScope = {
    api: options.api,
    shutdown: shutdownOf(app, options),
    keepaliveIntervalMs: options.keepaliveIntervalMs,
    stallMs: options.streamStallMs,
  };
  installHooks(app, scope.shutdown);
  const bodyLimit = limits.bodyLimitBytes;
  app.post("/v1/completions", { bodyLimit }, (request, reply) => postCompletion(scope, request, reply));
  app.post("/tokenize", { bodyLimit }, (request, reply) => postTokenize(scope, request, reply));
  app.post("/detokenize", { bodyLimit }, (request, reply) => postDetokenize(scope, request, reply));
  app.get("/v1/models", (request, reply) => getModels(scope, request, reply));
  // A wildcard, so that an id with a `/` matches URL-encoded (%2F) and also as two segments.
  app.get("/v1/models/*", (request, reply) => getModel(scope, request, reply));
  if (options.admin !== undefined) {
    registerAdminRoutes(app, { admin: options.admin, shutdown: scope.shutdown });
    registerUsageRoute(app, { admin: options.admin, shutdown: scope.shutdown });
  }
  await app.register(chatRoutes);
  // GET /openapi.json and the API reference at GET /docs.
  await app.register(apiDocsRoutes);
}

/**
 * The OpenAI-compatible REST surface as an encapsulated fastify plugin (register it as a sibling
 * of the Connect plugin): `POST /v1/completions` (JSON, or SSE with `stream: true`),
 * `GET /v1/models`, `GET /v1/models/{id}` (id or alias; `/` URL-encoded or not), vLLM's
 * `POST /tokenize` and `POST /detokenize`,
 * `POST /v1/chat/completions` (always 400), and `GET /openapi.json` and `GET /docs` (the OpenAPI
 * document and its rendering: src/surfaces/rest/api-docs.ts). In its scope: an `X-Request-Id` on every response,
 * bodies up to 8 MiB (413 above) — decoded when they carry `Content-Encoding: gzip`, `deflate` or
 * `br`, the 8 MiB then applying to the decoded body (415 for another coding) —, JSON only (415
 * otherwise), and every error rendered as the proto/API.md §7 envelope by {@link sendError}.
 */
export const restRoutes: FastifyPluginAsync<RestRoutesOptions> = registerRoutes;
