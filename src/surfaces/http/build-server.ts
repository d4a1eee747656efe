import type { Server } from "node:http";
import { createContextValues } from "@connectrpc/connect";
import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
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
import type { Registry } from "prom-client";
import { AdminService } from "../../../gen/acs/v1/admin_pb.js";
import { CompletionsService } from "../../../gen/acs/v1/completions_pb.js";
import { Health } from "../../../gen/grpc/health/v1/health_pb.js";
import { type Config, limits } from "../../config/index.js";
import type { SteeringBudget } from "../../lens/index.js";
import type { AdminApi, CompletionsApi } from "../../service/index.js";
import {
  callRecordKey,
  callRecordOf,
  createTracing,
  observeRequests,
  type RequestObserver,
  requestIdFrom,
  type Tracing,
  withRpcOutcome,
} from "../../telemetry/index.js";
import {
  handleUnmatchedRoute,
  renderMethodNotAllowed,
  requestTooLarge,
  restRoutes,
  unknownRoute,
} from "../rest/index.js";
import {
  compressionDeflate,
  connectJsonOptions,
  createAdminConnectRoutes,
  createConnectRoutes,
  createHealthRoutes,
  createReflectionRoutes,
  endTransportKey,
  releaseParsedBody,
  requestIdKey,
  withErrorEnvelopes,
} from "../rpc/index.js";
import { answerClientError, answerFrameworkError } from "./client-errors.js";
import { endTransport } from "./end-transport.js";
import { createLifecycle, type Lifecycle, shutdownError } from "./lifecycle.js";
import { createMetrics, type GatewayMetrics } from "./metrics.js";
import {
  createOnePortServer,
  defaultOnePortTimeouts,
  type OnePortServer,
  type OnePortTimeouts,
} from "./one-port-server.js";
import { OPS_PATHS, type OpsHandlers, registerOpsRoutes } from "./ops-server.js";
import { defaultPlaygroundDir, PLAYGROUND_PATH, playgroundRoutes } from "./playground-routes.js";
import { isRpcRequest, sendAnyError, sendRpcError } from "./send-any-error.js";

/** What buildServer needs. */
export interface ServerDeps {
  /** The settings the surfaces read (src/config, every default resolved there). */
  readonly config: Pick<Config, "keepaliveIntervalMs" | "streamStallMs">;
  readonly api: CompletionsApi;
  /** The admin service (REST under /v1/admin/, acs.v1.AdminService). @default none: no admin routes */
  readonly admin?: AdminApi;
  readonly logger: Logger;
  /** True once the gateway (and an embedded engine, if any) can serve: GET /readyz. */
  readonly isReady: () => boolean;
  /** Why it is not ready, in GET /readyz's `reasons` while isReady() is false. @default none */
  readonly notReadyReasons?: () => readonly string[];
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
  /** The built playground page (GET /playground). @default dist/playground of the package */
  readonly playgroundDir?: string;
  /**
   * Drain and shutdown (src/surfaces/http/lifecycle.ts): readiness, gRPC health and the calls follow its
   * phases; app.close() stops it. @default a lifecycle with no grace (app.close() ends calls at once)
   */
  readonly lifecycle?: Lifecycle;
  /**
   * Once the grace is over and the calls left have been sent their error, how long connections may
   * take to close on their own before they are destroyed, ms. @default 5000
   */
  readonly lingerMs?: number;
  /** Spans and `traceparent` propagation (src/telemetry). @default createTracing(): none recorded */
  readonly tracing?: Tracing;
  /**
   * The text GET /metrics answers, given this server's registry (a cluster worker asks the
   * primary for every worker's, src/app/cluster/; it rejects with an ApiError, answered as its
   * envelope, when the primary does not answer). @default the registry's own metrics
   */
  readonly scrapeMetrics?: (local: Registry) => Promise<string>;
}

/** Ops routes (GET/HEAD only); REST routes know their own methods (src/surfaces/rest). */

// Typed as an HTTP/1.1 server for fastify; HTTP/2 requests reach the same handler through the
// compatibility API, which fastify and connect-node both accept.
const oneServerFactory =
  (timeouts: OnePortTimeouts): FastifyServerFactory =>
  (handler) =>
    createOnePortServer(handler as Parameters<typeof createOnePortServer>[0], timeouts) as unknown as Server;

/**
 * Builds the gateway app, not yet listening (tests listen on port 0): REST (OpenAI-compatible),
 * Connect + gRPC + gRPC-Web (acs.v1.CompletionsService) and ops routes on one port, HTTP/1.1 and
 * h2c alike. The Connect plugin and the REST plugin are siblings: the Connect plugin replaces the
 * content-type parsers in its own scope. `flushAccessLog` writes the access lines still waiting for
 * their calls' tokens ({@link RequestObserver.flushWaiting}): for an exit that does not wait for
 * app.close().
 */
export async function buildServer(deps: ServerDeps): Promise<{
  app: FastifyInstance;
  metrics: GatewayMetrics;
  flushAccessLog: () => number;
  ops: OpsHandlers;
}> {
  const metrics = createMetrics(deps.steeringBudget);
  const lifecycle = deps.lifecycle ?? createLifecycle();
  const isReady = () => lifecycle.ready && deps.isReady();
  const tracing = deps.tracing ?? createTracing();
  const app = createFastify(deps);
  const server: ServerParts = { deps, app, metrics, lifecycle, isReady, tracing };
  refuseWhileStopped(server);
  // The access log, the request metrics and the gateway span of every request (src/telemetry).
  const requests = observeRequests(app, { metrics: metrics.calls, tracing });
  await registerCors(app);
  refuseDeclaredTooLarge(app);
  // Errors raised before a route's own handler (fastify's, or an unknown route) in each surface's
  // form. Set before the plugins register: routes keep the error handler of their registration.
  app.setErrorHandler((error, request, reply) => sendAnyError(request, reply, error));
  await app.register(async (rpc) => registerRpc(server, rpc));
  await app.register(restRoutes, {
    api: deps.api,
    ...(deps.admin === undefined ? {} : { admin: deps.admin }),
    keepaliveIntervalMs: deps.config.keepaliveIntervalMs,
    shutdown: lifecycle.link,
    streamStallMs: deps.config.streamStallMs,
  });
  await app.register(playgroundRoutes, { dir: deps.playgroundDir ?? defaultPlaygroundDir() });
  const ops = opsHandlers(server);
  registerOpsRoutes(app, ops);
  app.setNotFoundHandler(answerNotFound);
  closeInOrder(server);
  return { app, metrics, flushAccessLog: requests.flushWaiting, ops };
}

/** What the functions building one server share. */
interface ServerParts {
  readonly deps: ServerDeps;
  readonly app: FastifyInstance;
  readonly metrics: GatewayMetrics;
  readonly lifecycle: Lifecycle;
  /** The lifecycle's readiness and the gateway's (deps.isReady). */
  readonly isReady: () => boolean;
  readonly tracing: Tracing;
}

/** The fastify instance on the one-port server, its errors before routing in the envelope. */
function createFastify(deps: ServerDeps): FastifyInstance {
  return Fastify({
    loggerInstance: deps.logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: "requestId" }),
    serverFactory: oneServerFactory({ ...defaultOnePortTimeouts, ...deps.timeouts }),
    bodyLimit: limits.bodyLimitBytes,
    onProtoPoisoning: "error",
    onConstructorPoisoning: "error",
    // Requests that arrive while closing get the envelope from the hook below instead.
    return503OnClosing: false,
    forceCloseConnections: "idle",
    clientErrorHandler: answerClientError,
    // Errors fastify raises before routing (a malformed URL such as /v1/models/%zz) in the envelope.
    // Every request's id: the caller's X-Request-Id when it has the accepted form, else req_ + 32
    // hex (src/telemetry/request-id.ts); fastify's request.id, logged with each line as requestId.
    genReqId: (req) => requestIdFrom(req.headers["x-request-id"]),
    frameworkErrors: answerFrameworkError,
  });
}

/** Every response's X-Request-Id; once stopping, a new request is refused (503) but on the ops routes. */
function refuseWhileStopped({ app, lifecycle }: ServerParts): void {
  // Callback hooks (an async hook costs a promise per request); one that answers does not call done.
  app.addHook("onRequest", (request, reply, done) => {
    // Every response carries it, Connect's too (connect-fastify copies the reply's headers), also
    // when connect-es refuses a request before our handler runs.
    reply.header("x-request-id", request.id);
    // Stopping: calls in flight go on; a new request on a connection still open is refused (503
    // `upstream_unavailable`, a retryable error) and its HTTP/1.1 connection closed after it. The
    // ops routes still answer (/readyz: 503).
    if (!lifecycle.stopped || OPS_PATHS.has(request.url.split("?", 1)[0] ?? "")) {
      done();
      return;
    }
    if (request.raw.httpVersionMajor === 1) reply.header("connection", "close");
    sendAnyError(request, reply, shutdownError());
  });
}

/** CORS for browser callers: preflights without a key, the retry advice readable. */
async function registerCors(app: FastifyInstance): Promise<void> {
  await app.register(cors, {
    // Preflights succeed without a key; request headers are reflected, which allows
    // Authorization, Content-Type and the SDKs' x-stainless-* headers.
    origin: true,
    methods: ["GET", "POST", "OPTIONS"],
    // A browser caller may read them: the retry advice of a 429/503 (proto/API.md §9) too.
    exposedHeaders: [
      "x-request-id",
      "x-acs-max-tokens-clamped",
      "retry-after",
      "x-should-retry",
      "grpc-status",
      "grpc-message",
    ],
    maxAge: 600,
    // An OPTIONS without Origin is not a preflight; answer it rather than fail it in plain text.
    strictPreflight: false,
  });
}

/**
 * 413 on every route, before routing, for bodies that declare their size (after CORS, so a
 * browser can read it). fastify's bodyLimit covers chunked REST bodies; connect-node's
 * readMaxBytes chunked Connect bodies.
 */
function refuseDeclaredTooLarge(app: FastifyInstance): void {
  app.addHook("onRequest", (request, reply, done) => {
    const declared = request.headers["content-length"];
    if (declared === undefined || !(Number(declared) > limits.bodyLimitBytes)) {
      done();
      return;
    }
    sendAnyError(request, reply, requestTooLarge(limits.bodyLimitBytes));
  });
}

/**
 * The Connect plugin, in a scope of its own (`rpc`) that reads no body: any Content-Type reaches
 * connect-es, which refuses the ones it does not serve (415, answered with the envelope).
 */
async function registerRpc({ deps, lifecycle, isReady }: ServerParts, rpc: FastifyInstance): Promise<void> {
  // Strict like REST: an unknown field in Connect JSON is an error, not silently dropped, and the
  // bytes are read by REST's JSON parser (invalid UTF-8, a BOM, duplicate keys refused; every number
  // exact, an int64 seed too). The completion methods check their input's fields too (routes.ts).
  const jsonOptions = connectJsonOptions();
  rpc.removeAllContentTypeParsers();
  rpc.addContentTypeParser("*", (_request, _payload, done) => done(null, undefined));
  // Each RPC's response, for ending its transport (`contextValues` is given the request only).
  const responses = new WeakMap<FastifyRequest, FastifyReply["raw"]>();
  rpc.addHook("onRequest", (request, reply, done) => {
    responses.set(request, reply.raw);
    done();
  });
  await rpc.register(fastifyConnectPlugin, {
    // Every error of every RPC carries the envelope, whoever raises it (src/surfaces/rpc/error-envelopes.ts).
    // Outermost: the code each RPC ends with, as sent, for the access log and the metrics.
    routes: withRpcOutcome(
      withErrorEnvelopes(
        (router) => {
          createConnectRoutes(deps.api, lifecycle.link, {
            streamStallMs: deps.config.streamStallMs,
            logger: deps.logger,
          })(router);
          if (deps.admin !== undefined) createAdminConnectRoutes(deps.admin, lifecycle.link)(router);
          createHealthRoutes(isReady, deps.modelStatus, { lifecycle })(router);
          createReflectionRoutes([
            CompletionsService,
            ...(deps.admin === undefined ? [] : [AdminService]),
            Health,
          ])(router);
        },
        {
          readMaxBytes: limits.bodyLimitBytes,
          onInternalError: (err, requestId) =>
            deps.logger.error({ err, requestId }, "RPC failed in connect-es"),
        },
      ),
    ),
    interceptors: [releaseParsedBody],
    readMaxBytes: limits.bodyLimitBytes,
    // The request compressions REST accepts too (gzip, deflate, br, identity).
    acceptCompression: [compressionGzip, compressionBrotli, compressionDeflate],
    jsonOptions,
    contextValues: (request) =>
      createContextValues()
        .set(requestIdKey, request.id)
        .set(callRecordKey, callRecordOf(request))
        // A stalled stream ends its transport (HTTP/1.1: the connection; HTTP/2: the stream).
        .set(endTransportKey, () => {
          const response = responses.get(request);
          if (response !== undefined) endTransport(request.raw, response);
        }),
    grpc: true,
    grpcWeb: true,
    connect: true,
  });
}

/** What the ops routes answer, here and on the ops port (src/surfaces/http/ops-server.ts). */
function opsHandlers({ deps, lifecycle, isReady, metrics }: ServerParts): OpsHandlers {
  return {
    live: () => true,
    readiness: () => {
      const ready = isReady();
      const models = Object.fromEntries(
        (deps.modelStatus?.() ?? []).map((m) => [m.id, m.serving ? "serving" : "not_serving"] as const),
      );
      if (ready) return { ready, models };
      const reasons = [
        ...(lifecycle.ready ? [] : ["draining: the gateway is shutting down"]),
        ...(deps.notReadyReasons?.() ?? []),
      ];
      return { ready, models, reasons };
    },
    metrics: async () => ({
      contentType: metrics.registry.contentType,
      text: await (deps.scrapeMetrics?.(metrics.registry) ?? metrics.registry.metrics()),
    }),
  };
}

/** No route: 405 on the GET-only paths, the RPC form for an RPC, else REST's 404 (or 405). */
function answerNotFound(request: FastifyRequest, reply: FastifyReply) {
  const path = request.url.split("?", 1)[0] ?? "";
  // The ops routes and the playground page (and its assets) take GET and HEAD only; a GET of an
  // asset that does not exist comes here too (@fastify/static), and stays a 404.
  const playground = path === PLAYGROUND_PATH || path.startsWith(`${PLAYGROUND_PATH}/`);
  if (OPS_PATHS.has(path) || (playground && request.method !== "GET" && request.method !== "HEAD")) {
    return renderMethodNotAllowed(request, reply, ["GET", "HEAD"]);
  }
  // An unknown method answers in its protocol: gRPC UNIMPLEMENTED, Connect 404 unimplemented.
  if (isRpcRequest(request)) return sendRpcError(request, reply, unknownRoute(request));
  return handleUnmatchedRoute(request, reply);
}

/**
 * app.close(): stop accepting (fastify then closes idle connections and the listener), give the
 * calls in flight the grace, end the rest; connections still open `lingerMs` after that (a
 * client that does not read its error) are destroyed, so that close() always resolves. Then
 * deps.onClose, then the tracing's shutdown.
 */
function closeInOrder({ deps, app, lifecycle, tracing }: ServerParts): void {
  const lingerMs = deps.lingerMs ?? 5000;
  let linger: NodeJS.Timeout | undefined;
  lifecycle.onChange((phase) => {
    if (phase !== "ending" || linger !== undefined) return;
    linger = setTimeout(() => (app.server as unknown as OnePortServer).closeAllConnections(), lingerMs);
    linger.unref();
  });
  app.addHook("preClose", async () => lifecycle.stop());
  app.addHook("onClose", async () => {
    clearTimeout(linger);
    lifecycle.dispose();
  });
  const onClose = deps.onClose;
  app.addHook("onClose", async () => {
    try {
      await onClose?.();
    } finally {
      await tracing.shutdown();
    }
  });
}
