// A gateway process serving the port: the single process, or one cluster worker (ACS_WORKERS > 1,
// src/app/cluster/). buildApp → listen → the "listening" line (a worker tells the primary,
// which logs it once) → the ops port (a single process only) → shutdown on signals.
import type { AddressInfo } from "node:net";
import type { Logger } from "pino";
import type { Config, ModelConfig } from "../config/index.js";
import { admissionLimitsFrom } from "../service/index.js";
import { createLifecycle } from "../surfaces/http/lifecycle.js";
import { listenOps, type OpsHandlers, opsListenRefusal } from "../surfaces/http/ops-server.js";
import { type App, buildApp } from "./build-app.js";
import type { ClusterWorker } from "./cluster/index.js";
import { refuse, warnKeysOff } from "./operator-lines.js";
import { shutDownOnSignals } from "./process-shutdown.js";

/** The embedded engine as a gateway process sees it (a worker's has no stop: the primary runs it). */
export interface ProcessEngine {
  readonly model: ModelConfig;
  isAlive(): boolean;
  readonly stop: (() => Promise<void>) | undefined;
}

/** What {@link runGateway} runs: the configuration, and the cluster side when it is a worker. */
export interface GatewayProcess {
  readonly config: Config;
  readonly logger: Logger;
  /** This process's cluster side (src/app/cluster/worker.ts); undefined for a single process. */
  readonly worker: ClusterWorker | undefined;
  /** The embedded engine (no ACS_MODELS), already started; undefined with ACS_MODELS. */
  readonly embedded: ProcessEngine | undefined;
}

/**
 * Builds the gateway and serves the port until a signal closes it (the process then exits, in
 * src/app/process-shutdown.ts). Exits with code 2 and one line when the port or the ops port
 * cannot be bound (in use, no permission, not an address of this machine); rejects with what
 * buildApp rejects with (a ConfigError for a keys database that cannot be opened).
 */
export async function runGateway(run: GatewayProcess): Promise<void> {
  const { config, logger, worker, embedded } = run;
  if (config.db === undefined && !worker) warnKeysOff(logger, config.host);
  const models = embedded ? [embedded.model] : config.models;
  const lifecycle = createLifecycle({ graceMs: config.shutdownGraceMs });
  const built = await buildApp(
    { ...config, models, ...(worker ? { instanceId: worker.instanceId } : {}) },
    {
      logger,
      isReady: () => embedded?.isAlive() ?? true,
      lifecycle,
      ...(embedded?.stop ? { onClose: embedded.stop } : {}),
      ...(worker
        ? { scrapeMetrics: worker.scrape, admission: worker.admission(admissionLimitsFrom(config)) }
        : {}),
    },
  );
  worker?.registerMetrics(built.metrics);
  await listen(built, config);
  const listening = listeningInfo(built, models);
  if (worker) worker.listening(listening);
  else logger.info(listening, `acs-gateway listening on ${listening.url} (REST, Connect, gRPC-Web, gRPC)`);
  // A worker reports to the primary at least once a second: its ops port (ACS_OPS_PORT) answers
  // from these, and it kills a worker silent for ACS_WORKER_TIMEOUT_MS. A single process serves
  // the ops port on a listening socket of its own.
  if (worker) worker.reportReadiness(built.ops.readiness);
  if (!worker && config.opsPort !== undefined) await serveOps(built.ops, config, config.opsPort, logger);
  shutDownOnSignals(
    { app: built.app, lifecycle, flushAccessLog: built.flushAccessLog, config, logger },
    worker,
  );
}

/** Listens on HOST:PORT; an operator's mistake (the port in use…) is one line and exit code 2. */
async function listen({ app }: App, config: Config): Promise<void> {
  try {
    // The accept queue as long as the kernel allows (net.core.somaxconn; Node's default is 511):
    // a burst of new connections waits in it while the event loop (every worker's, with
    // ACS_WORKERS) is busy, rather than overflowing it and being reset.
    await app.listen({ host: config.host, port: config.port, backlog: 65_535 });
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    if (code === "EADDRINUSE") refuse(`PORT=${config.port}: the port is in use on ${config.host}`);
    if (code === "EACCES") refuse(`PORT=${config.port}: no permission to bind it on ${config.host}`);
    if (code === "EADDRNOTAVAIL" || code === "ENOTFOUND")
      refuse(`HOST=${config.host}: not an address of this machine`);
    throw err;
  }
}

/** The "listening" line's fields: the port bound (PORT=0 takes any free one), each model's names. */
function listeningInfo({ app, registry }: App, models: readonly ModelConfig[]) {
  const { address, port, family } = app.server.address() as AddressInfo;
  const url = `http://${family === "IPv6" ? `[${address}]` : address}:${port}`;
  return {
    url,
    port,
    models: registry.status().map((m) => ({
      names: [m.id, ...(models.find((c) => c.id === m.id)?.aliases ?? [])],
      serving: m.serving,
    })),
  };
}

/** The ops routes on ACS_OPS_PORT; a port that cannot be bound is one line and exit code 2. */
async function serveOps(ops: OpsHandlers, config: Config, opsPort: number, logger: Logger): Promise<void> {
  try {
    const served = await listenOps(ops, { host: config.host, port: opsPort, logger });
    logger.info(
      { url: served.url, port: served.port },
      `ops routes (/healthz, /readyz, /metrics) on ${served.url}`,
    );
  } catch (err) {
    refuse(opsListenRefusal(err, opsPort, config.host));
  }
}
