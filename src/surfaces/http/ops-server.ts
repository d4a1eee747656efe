// The ops port (ACS_OPS_PORT): GET /healthz, /readyz and /metrics on a listening socket of their
// own. A probe there never waits in the main port's accept queue behind the callers' connections
// (10,000 streams opening at 1,000 a second kept a /healthz probe on the main port waiting for
// seconds, in the bare proxy's queue too), and with ACS_WORKERS > 1 the cluster's primary answers
// it: its event loop does none of the requests' work.
import type { AddressInfo } from "node:net";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, LogController } from "fastify";
import { requestIdFrom } from "../../telemetry/request-id.js";
import { renderMethodNotAllowed, renderNotFound, requestIdOf, sendError } from "../rest/send-error.js";
import { answerClientError, answerFrameworkError } from "./client-errors.js";
import { packageVersion } from "./package-root.js";

/**
 * What GET /readyz answers: 200 `{"status":"ready","models":{…}}` or 503 `"not_ready"` with the
 * `reasons` it is not.
 */
export interface Readiness {
  readonly ready: boolean;
  /** Each model id: `serving` or `not_serving`. */
  readonly models: Readonly<Record<string, "serving" | "not_serving">>;
  /** While not ready: why, one sentence each (draining, no model serves, the ledger cannot write). */
  readonly reasons?: readonly string[];
}

/** The three ops answers, as the process serving them knows them. */
export interface OpsHandlers {
  /** GET /healthz: true → 200 `{"status":"ok"}`; false → 503 `{"status":"not_ok"}`. */
  live(): boolean;
  /** GET /readyz. */
  readiness(): Readiness;
  /** GET /metrics: Prometheus text and its Content-Type. */
  metrics(): Promise<{ readonly contentType: string; readonly text: string }>;
}

/** The ops routes' paths (vLLM's probes `/health` and `/version` among them): GET and HEAD only. */
export const OPS_PATHS: ReadonlySet<string> = new Set([
  "/healthz",
  "/readyz",
  "/metrics",
  "/health",
  "/version",
]);

/** GET /readyz's status and body, the same on the main port and the ops port. */
export function readyzAnswer(readiness: Readiness): {
  status: 200 | 503;
  body: { status: "ready" | "not_ready"; models: Readiness["models"]; reasons?: readonly string[] };
} {
  if (readiness.ready) return { status: 200, body: { status: "ready", models: readiness.models } };
  return {
    status: 503,
    body: { status: "not_ready", models: readiness.models, reasons: readiness.reasons ?? [] },
  };
}

/**
 * Why the ops port could not listen, as the one stderr line says it (exit code 2): `ACS_OPS_PORT=N:
 * the port is in use on HOST` (EADDRINUSE), `… no permission to bind it on HOST` (EACCES), else
 * the error itself. The single process and the cluster's primary both say it so.
 */
export function opsListenRefusal(err: unknown, opsPort: number, host: string): string {
  const code = (err as { code?: unknown }).code;
  const why =
    code === "EADDRINUSE"
      ? `the port is in use on ${host}`
      : code === "EACCES"
        ? `no permission to bind it on ${host}`
        : String(err);
  return `ACS_OPS_PORT=${opsPort}: ${why}`;
}

/**
 * Registers GET (and HEAD) /healthz, /readyz, /metrics, /health and /version on `app`, answered
 * from `handlers`: the main port and the ops port serve the same bodies. /healthz 200
 * `{"status":"ok"}` or 503 `{"status":"not_ok"}`; /readyz as {@link readyzAnswer}; /metrics the
 * Prometheus text with its Content-Type; /health (vLLM's) /readyz's status with an empty body;
 * /version (vLLM's) `{"version": "<package.json version>"}`. A handler's error goes to the app's error handler (the envelope, 500).
 */
export function registerOpsRoutes(app: FastifyInstance, handlers: OpsHandlers): void {
  app.get("/healthz", async (_request, reply) =>
    handlers.live() ? reply.send({ status: "ok" }) : reply.code(503).send({ status: "not_ok" }),
  );
  app.get("/readyz", async (_request, reply) => {
    const { status, body } = readyzAnswer(handlers.readiness());
    return reply.code(status).send(body);
  });
  app.get("/metrics", async (_request, reply) => {
    const { contentType, text } = await handlers.metrics();
    return reply.header("content-type", contentType).send(text);
  });
  // vLLM's probe: what /readyz says, in vLLM's form (an empty body; 200 or 503).
  app.get("/health", async (_request, reply) => reply.code(readyzAnswer(handlers.readiness()).status).send());
  // vLLM's `{"version": …}`, with the gateway's own version (package.json).
  app.get("/version", async (_request, reply) => reply.send({ version: packageVersion() }));
}

/**
 * Starts the ops server on host:port (port 0: any free one) and resolves once it listens, with its
 * URL. Every answer carries `X-Request-Id` (the caller's when it has the accepted form); any other
 * path is 404 `unknown_route`, another method on an ops path 405 `method_not_allowed` with
 * `Allow: GET, HEAD`, both with the error envelope of proto/API.md §7. No access line is logged
 * (probes are not requests of the API). Rejects with the listen error (EADDRINUSE for a port in
 * use). `close()` ends it.
 */
export async function listenOps(
  handlers: OpsHandlers,
  options: { readonly host: string; readonly port: number; readonly logger: FastifyBaseLogger },
): Promise<{ readonly app: FastifyInstance; readonly url: string; readonly port: number }> {
  const app = Fastify({
    loggerInstance: options.logger,
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: "requestId" }),
    genReqId: (req) => requestIdFrom(req.headers["x-request-id"]),
    // A malformed URL or HTTP/1.1 request: the envelope too, as on the main port.
    frameworkErrors: answerFrameworkError,
    clientErrorHandler: answerClientError,
    return503OnClosing: false,
  });
  app.addHook("onRequest", (request, reply, done) => {
    reply.header("x-request-id", request.id);
    done();
  });
  app.setErrorHandler((error, _request, reply) => sendError(reply, error, requestIdOf(reply)));
  registerOpsRoutes(app, handlers);
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split("?", 1)[0] ?? "";
    if (OPS_PATHS.has(path)) return renderMethodNotAllowed(request, reply, ["GET", "HEAD"]);
    return renderNotFound(request, reply);
  });
  await app.listen({ host: options.host, port: options.port });
  const { address, port, family } = app.server.address() as AddressInfo;
  return { app, url: `http://${family === "IPv6" ? `[${address}]` : address}:${port}`, port };
}
