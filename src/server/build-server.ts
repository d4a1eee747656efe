import { type Server, STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import { createContextValues } from "@connectrpc/connect";
import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import cors from "@fastify/cors";
import Fastify, {
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  type FastifyServerFactory,
  LogController,
} from "fastify";
import type { Logger } from "pino";
import { type Config, limits } from "../config/index.js";
import {
  createConnectRoutes,
  createHealthRoutes,
  requestIdKey,
  toConnectError,
  writeProtocolError,
} from "../connect/index.js";
import { ApiError, invalidRequest, newRequestId } from "../errors/index.js";
import type { SteeringBudget } from "../lens/index.js";
import {
  handleUnmatchedRoute,
  renderMethodNotAllowed,
  requestIdOf,
  requestTooLarge,
  restRoutes,
  sendError,
} from "../rest/index.js";
import type { CompletionsApi } from "../service/index.js";
import { createMetrics, type GatewayMetrics } from "./metrics.js";
import { createOnePortServer, defaultOnePortTimeouts, type OnePortTimeouts } from "./one-port-server.js";

/** What buildServer needs. */
export interface ServerDeps {
  readonly config: Pick<Config, "keepaliveIntervalMs">;
  readonly api: CompletionsApi;
  readonly logger: Logger;
  /** True once the gateway (and an embedded engine, if any) can serve: GET /readyz. */
  readonly isReady: () => boolean;
  /**
   * Each model (by id) and whether it serves: in GET /readyz's body and as gRPC health services
   * named by the model id. @default none
   */
  readonly modelStatus?: () => ReadonlyArray<{ readonly id: string; readonly serving: boolean }>;
  /** Connection timeouts (tests shorten them). @default defaultOnePortTimeouts */
  readonly timeouts?: Partial<OnePortTimeouts>;
  /** Runs last in app.close() (e.g. close upstream pools, the ledger, an embedded engine). */
  readonly onClose?: () => Promise<void>;
  /** The service's steering budget, for its gauges on /metrics. */
  readonly steeringBudget?: SteeringBudget;
}

/** Ops routes (GET/HEAD only); REST routes know their own methods (src/rest). */
const opsPaths = new Set(["/healthz", "/readyz", "/metrics"]);

// Typed as an HTTP/1.1 server for fastify; HTTP/2 requests reach the same handler through the
// compatibility API, which fastify and connect-node both accept.
const oneServerFactory =
  (timeouts: OnePortTimeouts): FastifyServerFactory =>
  (handler) =>
    createOnePortServer(handler as Parameters<typeof createOnePortServer>[0], timeouts) as unknown as Server;

/** Connect, gRPC and gRPC-Web paths: /<package>.<Service>/<Method>. */
function isConnectPath(url: string): boolean {
  return url.startsWith("/acs.v1.") || url.startsWith("/grpc.health.v1.");
}

function routeLabel(request: FastifyRequest): string {
  return request.routeOptions.url ?? "unknown";
}

/**
 * Answers an HTTP/1.1 connection Node could not parse (fastify's `clientErrorHandler`; the one-port
 * server calls it once the responses to the requests before the error are written), then closes
 * it: 400 `invalid_request` (413 `request_too_large` for chunk extensions over Node's limit) with
 * the envelope and `X-Request-Id`; a request past its deadline (408) or with headers over Node's
 * limit (431) as Node answers them, without a body (the error catalogue has no code for these).
 */
function answerClientError(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === "ECONNRESET" || socket.destroyed) return;
  let head: string;
  if (err.code === "ERR_HTTP_REQUEST_TIMEOUT")
    head = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n";
  else if (err.code === "HPE_HEADER_OVERFLOW")
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n";
  else {
    const id = newRequestId();
    const reason = err.message.replace(/^Parse Error: /, "");
    const error =
      err.code === "HPE_CHUNK_EXTENSIONS_OVERFLOW"
        ? new ApiError("request_too_large", `Malformed HTTP/1.1 request: ${reason}`)
        : invalidRequest(null, `Malformed HTTP/1.1 request: ${reason}`);
    const body = JSON.stringify(error.toEnvelope(id));
    head =
      `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\n` +
      "Content-Type: application/json; charset=utf-8\r\n" +
      `Content-Length: ${Buffer.byteLength(body)}\r\nX-Request-Id: ${id}\r\nConnection: close\r\n\r\n${body}`;
  }
  if (socket.writable) socket.write(head);
  socket.destroy();
}

/**
 * Builds the gateway app, not yet listening (tests listen on port 0): REST (OpenAI-compatible),
 * Connect + gRPC + gRPC-Web (acs.v1.CompletionsService) and ops routes on one port, HTTP/1.1 and
 * h2c alike. The Connect plugin and the REST plugin are siblings: the Connect plugin replaces the
 * content-type parsers in its own scope.
 */
export async function buildServer(
  deps: ServerDeps,
): Promise<{ app: FastifyInstance; metrics: GatewayMetrics }> {
  const metrics = createMetrics(deps.steeringBudget);
  const app = Fastify({
    loggerInstance: deps.logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: "requestId" }),
    serverFactory: oneServerFactory({ ...defaultOnePortTimeouts, ...deps.timeouts }),
    bodyLimit: limits.bodyLimitBytes,
    onProtoPoisoning: "error",
    onConstructorPoisoning: "error",
    return503OnClosing: true,
    forceCloseConnections: "idle",
    clientErrorHandler: answerClientError,
    // Errors fastify raises before routing (a malformed URL such as /v1/models/%zz) in the envelope.
    // Every request's id (req_ + 32 hex): fastify's request.id, logged with each line as requestId.
    genReqId: () => newRequestId(),
    frameworkErrors: (error, _request, reply) => {
      const id = newRequestId();
      reply.header("x-request-id", id);
      return sendError(reply, invalidRequest(null, `Malformed request URL: ${error.message}`), id);
    },
  });

  app.addHook("onRequest", async (request, reply) => {
    // Every response carries it, Connect's too (connect-fastify copies the reply's headers), also
    // when connect-es refuses a request before our handler runs.
    reply.header("x-request-id", request.id);
  });
  app.addHook("onResponse", async (request, reply) => {
    const url = request.url;
    const surface = isConnectPath(url) ? "connect" : url.startsWith("/v1/") ? "rest" : "ops";
    metrics.requests.inc({ surface, route: routeLabel(request), status: String(reply.statusCode) });
    metrics.duration.observe({ surface, route: routeLabel(request) }, reply.elapsedTime / 1000);
  });

  await app.register(cors, {
    // Preflights succeed without a key; request headers are reflected, which allows
    // Authorization, Content-Type and the SDKs' x-stainless-* headers.
    origin: true,
    methods: ["GET", "POST", "OPTIONS"],
    exposedHeaders: ["x-request-id", "x-acs-max-tokens-clamped", "grpc-status", "grpc-message"],
    maxAge: 600,
    // An OPTIONS without Origin is not a preflight; answer it rather than fail it in plain text.
    strictPreflight: false,
  });

  // 413 on every route, before routing, for bodies that declare their size (after CORS, so a
  // browser can read it). fastify's bodyLimit covers chunked REST bodies; connect-node's
  // readMaxBytes chunked Connect bodies.
  app.addHook("onRequest", async (request, reply) => {
    const length = Number(request.headers["content-length"] ?? 0);
    if (!(length > limits.bodyLimitBytes)) return;
    const id = requestIdOf(reply);
    const err = requestTooLarge(limits.bodyLimitBytes);
    if (!isConnectPath(request.url)) return sendError(reply, err, id);
    reply.hijack();
    reply.raw.setHeader("x-request-id", id);
    writeProtocolError(request.headers["content-type"], toConnectError(err, id), err.status, reply.raw);
    return reply;
  });

  await app.register(fastifyConnectPlugin, {
    routes: (router) => {
      createConnectRoutes(deps.api)(router);
      createHealthRoutes(deps.isReady, deps.modelStatus)(router);
    },
    readMaxBytes: limits.bodyLimitBytes,
    // Strict like REST: an unknown field in Connect JSON is an error, not silently dropped.
    jsonOptions: { ignoreUnknownFields: false },
    contextValues: (request) => createContextValues().set(requestIdKey, request.id),
    grpc: true,
    grpcWeb: true,
    connect: true,
  });
  await app.register(restRoutes, { api: deps.api, keepaliveIntervalMs: deps.config.keepaliveIntervalMs });

  app.get("/healthz", async (_request, reply) => reply.send({ status: "ok" }));
  app.get("/readyz", async (_request, reply) => {
    const ready = deps.isReady();
    const models = Object.fromEntries(
      (deps.modelStatus?.() ?? []).map((m) => [m.id, m.serving ? "serving" : "not_serving"]),
    );
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "not_ready", models });
  });
  app.get("/metrics", async (_request, reply) => {
    const text = await metrics.registry.metrics();
    return reply.header("content-type", metrics.registry.contentType).send(text);
  });

  app.setNotFoundHandler((request: FastifyRequest, reply: FastifyReply) => {
    if (opsPaths.has(request.url.split("?", 1)[0] ?? "")) {
      return renderMethodNotAllowed(request, reply, ["GET", "HEAD"]);
    }
    return handleUnmatchedRoute(request, reply);
  });
  app.setErrorHandler((error, _request, reply) => sendError(reply, error, requestIdOf(reply)));

  if (deps.onClose) {
    const onClose = deps.onClose;
    app.addHook("onClose", async () => onClose());
  }
  return { app, metrics };
}
