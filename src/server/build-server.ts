import type { Server } from "node:http";
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
import type { Config } from "../config/index.js";
import { createConnectRoutes, createHealthRoutes, requestIdKey } from "../connect/index.js";
import { ApiError, newRequestId } from "../errors/index.js";
import { handleUnmatchedRoute, renderMethodNotAllowed, restRoutes, sendError } from "../rest/index.js";
import type { CompletionsApi } from "../service/index.js";
import { createMetrics, type GatewayMetrics } from "./metrics.js";
import { createOnePortServer } from "./one-port-server.js";

/** What buildServer needs. */
export interface ServerDeps {
  readonly config: Pick<Config, "keepaliveIntervalMs" | "bodyLimitBytes">;
  readonly api: CompletionsApi;
  readonly logger: Logger;
  /** True once the gateway (and an embedded engine, if any) can serve: GET /readyz. */
  readonly isReady: () => boolean;
  /** Runs last in app.close() (e.g. close upstream pools, the ledger, an embedded engine). */
  readonly onClose?: () => Promise<void>;
}

/** Ops routes (GET/HEAD only); REST routes know their own methods (src/rest). */
const opsPaths = new Set(["/healthz", "/readyz", "/metrics"]);

// Typed as an HTTP/1.1 server for fastify; HTTP/2 requests reach the same handler through the
// compatibility API, which fastify and connect-node both accept.
const oneServerFactory: FastifyServerFactory = (handler) =>
  createOnePortServer(handler as Parameters<typeof createOnePortServer>[0]) as unknown as Server;

/** Connect, gRPC and gRPC-Web paths: /<package>.<Service>/<Method>. */
function isConnectPath(url: string): boolean {
  return url.startsWith("/acs.v1.") || url.startsWith("/grpc.health.v1.");
}

function tooLarge(limit: number): ApiError {
  return new ApiError("request_too_large", `Request body too large: the limit is ${limit} bytes (8 MiB).`);
}

const requestIds = new WeakMap<FastifyRequest, string>();

/** The request id given to a request by the root hook (REST routes may set their own). */
function requestIdOf(request: FastifyRequest): string {
  return requestIds.get(request) ?? newRequestId();
}

function routeLabel(request: FastifyRequest): string {
  return request.routeOptions.url ?? "unknown";
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
  const metrics = createMetrics();
  const app = Fastify({
    loggerInstance: deps.logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    serverFactory: oneServerFactory,
    bodyLimit: deps.config.bodyLimitBytes,
    onProtoPoisoning: "error",
    onConstructorPoisoning: "error",
    return503OnClosing: true,
    forceCloseConnections: "idle",
  });

  app.addHook("onRequest", async (request, reply) => {
    const id = newRequestId();
    requestIds.set(request, id);
    // Connect routes send it as a response header of their own (src/connect).
    if (!isConnectPath(request.url)) reply.header("x-request-id", id);
    // 413 on every route, before routing, for bodies that declare their size (fastify's bodyLimit
    // covers chunked bodies of the REST routes; connect-node's readMaxBytes the Connect routes').
    const length = Number(request.headers["content-length"] ?? 0);
    if (length > deps.config.bodyLimitBytes && !isConnectPath(request.url)) {
      return sendError(reply, tooLarge(deps.config.bodyLimitBytes), id);
    }
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
  });

  await app.register(fastifyConnectPlugin, {
    routes: (router) => {
      createConnectRoutes(deps.api)(router);
      createHealthRoutes(deps.isReady)(router);
    },
    readMaxBytes: deps.config.bodyLimitBytes,
    contextValues: (request) => createContextValues().set(requestIdKey, requestIds.get(request)),
    grpc: true,
    grpcWeb: true,
    connect: true,
  });
  await app.register(restRoutes, { api: deps.api, keepaliveIntervalMs: deps.config.keepaliveIntervalMs });

  app.get("/healthz", async (_request, reply) => reply.send({ status: "ok" }));
  app.get("/readyz", async (_request, reply) => {
    const ready = deps.isReady();
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "starting" });
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
  app.setErrorHandler((error, request, reply) => sendError(reply, error, requestIdOf(request)));

  if (deps.onClose) {
    const onClose = deps.onClose;
    app.addHook("onClose", async () => onClose());
  }
  return { app, metrics };
}
