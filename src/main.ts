// Process entry: loadConfig() → (embedded engine) → buildApp() → listen; SIGTERM/SIGINT → drain
// and close (src/server/lifecycle.ts).
// A mistake in the configuration (a keys database that cannot be opened too) is one line on stderr
// and exit code 2; the first log line comes before anything slow (the server's modules are
// imported after it, the engine is started after it).
import { type ChildProcess, spawn } from "node:child_process";
import type { AddressInfo } from "node:net";
import { extname } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import type { pino } from "pino";
import { type Config, ConfigError, loadConfig, type ModelConfig } from "./config/index.js";
import { onShutdownSignals } from "./server/shutdown-signals.js";
import { admissionLimitsFrom } from "./service/admission.js";
import { createLogger } from "./telemetry/logger.js";

/** Exit code of an operator's mistake (configuration, a port in use): one line on stderr. */
const USAGE_EXIT = 2;

function refuse(message: string): never {
  process.stderr.write(`acs-gateway: ${message}\n`);
  process.exit(USAGE_EXIT);
}

/** Back-off before restarting the embedded engine after its n-th exit in a row (0-based), ms. */
const engineRestartDelayMs = (n: number): number => Math.min(30_000, 500 * 2 ** n);
/** An engine that stayed up this long is counted as healthy: the back-off starts over, ms. */
const ENGINE_STABLE_MS = 60_000;

/**
 * Starts the reference engine as a child process on a loopback port (as Inference runs beside the
 * gateway in production): its CPU-bound forward passes and tokenizer then never block the
 * gateway's event loop. Resolves once it listens; the child is killed when this process exits.
 *
 * The child leads a process group of its own, so a signal to the gateway's group (Ctrl-C,
 * `kill -- -PGID`, systemd's KillMode=control-group) does not reach it: the gateway drains with
 * it serving and stops it afterwards (`stop()`, an onClose hook). It never outlives the gateway:
 * it exits when its stdin (a pipe from this process) ends, which a SIGKILL of this process does too.
 *
 * Supervised: when the child dies (a crash, `kill -9`), it is started again on the same port after
 * a back-off (0.5 s, doubling to 30 s; back to 0.5 s once it has stayed up a minute), each step
 * logged; `isAlive()` (hence `/readyz` and gRPC health) is false until it listens again. `stop()`
 * ends the supervision and the child.
 */
async function startEmbeddedEngine(config: Config, logger: pino.Logger) {
  // Only main.ts may start the reference engine; the gateway never imports it otherwise.
  const { getPreset } = await import("./engine/index.js");
  const preset = config.embeddedEngine?.preset ?? "llama-8b";
  const dims = getPreset(preset);
  // The engine's own extension: dist/src/engine/main.js under `npm start`, .ts under tsx.
  const entry = fileURLToPath(
    new URL(`./engine/main${extname(fileURLToPath(import.meta.url))}`, import.meta.url),
  );
  let child: ChildProcess | undefined;
  process.on("exit", () => child?.kill("SIGTERM"));

  /** Spawns the engine on `port` (0: any); resolves with its URL once it listens. */
  const spawnEngine = (port: number) => {
    const c = spawn(
      process.execPath,
      [...process.execArgv, entry, "--preset", preset, "--port", String(port), "--exit-with-stdin"],
      { stdio: ["pipe", "pipe", "inherit"], detached: true },
    );
    child = c;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
      c.once("exit", (code, signal) => resolve({ code, signal })),
    );
    const listening = new Promise<string>((resolve, reject) => {
      let out = "";
      c.stdout?.setEncoding("utf8");
      const onData = (d: string) => {
        out += d;
        const m = /serving .* at (http:\/\/[^\s]+)/.exec(out);
        if (!m?.[1]) return;
        c.stdout?.off("data", onData);
        c.stdout?.resume(); // its later output is not kept
        resolve(m[1]);
      };
      c.stdout?.on("data", onData);
      void exited.then(({ code, signal }) =>
        reject(new Error(`reference engine exited (code ${code}, signal ${signal}) before listening`)),
      );
    });
    return { child: c, exited, listening };
  };

  const first = spawnEngine(0);
  const url = await first.listening;
  const port = Number(new URL(url).port);
  let alive = true;
  const stopping = new AbortController();
  logger.info(
    { url, preset, model: dims.servedModelName, enginePid: first.child.pid },
    "reference engine started (no ACS_MODELS)",
  );

  // The supervision loop: wait for the child's exit, back off, start it again on the same port.
  const supervise = async (running: ReturnType<typeof spawnEngine>) => {
    let current = running;
    let failures = 0;
    let upSince = Date.now();
    for (;;) {
      const { code, signal } = await current.exited;
      alive = false;
      if (stopping.signal.aborted) return;
      if (Date.now() - upSince >= ENGINE_STABLE_MS) failures = 0;
      const delayMs = engineRestartDelayMs(failures);
      failures += 1;
      logger.error(
        { code, signal, enginePid: current.child.pid, restartInMs: delayMs, attempt: failures },
        `reference engine exited; restarting it in ${delayMs} ms (not ready meanwhile)`,
      );
      try {
        await sleep(delayMs, undefined, { signal: stopping.signal });
      } catch {
        return;
      }
      current = spawnEngine(port);
      try {
        await current.listening;
      } catch (err) {
        logger.error({ err, attempt: failures }, "reference engine restart failed");
        continue;
      }
      if (stopping.signal.aborted) return;
      alive = true;
      upSince = Date.now();
      logger.info({ url, enginePid: current.child.pid, attempt: failures }, "reference engine restarted");
    }
  };
  const supervised = supervise(first);

  const model: ModelConfig = {
    id: dims.servedModelName,
    aliases: config.embeddedEngine?.aliases ?? [],
    upstreams: [{ url, apiKey: undefined, weight: 1 }],
    servedModelName: dims.servedModelName,
    maxModelLen: undefined, // read from the engine's /v1/models
    hiddenSize: dims.hiddenSize,
    numLayers: dims.numLayers,
    ownedBy: "acs-reference-engine",
    byteLevelTokenizer: true, // the engine's tokenizers (byte, Llama 3) are byte-level BPE
  };
  const stop = async () => {
    stopping.abort();
    const c = child;
    if (c !== undefined && c.exitCode === null && c.signalCode === null) {
      const gone = new Promise<void>((resolve) => c.once("exit", () => resolve()));
      c.kill("SIGTERM");
      await gone;
    }
    await supervised;
    logger.info("reference engine stopped");
  };
  return { model, isAlive: () => alive, stop };
}

function warnKeysOff(logger: pino.Logger, host: string): void {
  logger.warn({ host }, "ACS_DB is not set: authentication and Budgets are OFF (loopback only)");
}

async function main(): Promise<void> {
  let config: Config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) refuse(err.message);
    throw err;
  }
  const logger = createLogger({ level: config.logLevel, format: config.logFormat });
  // ACS_WORKERS > 1: this process is the cluster's primary, or one of its workers (src/server/cluster.ts).
  const cluster = config.workers > 1 ? await import("./server/cluster.js") : undefined;
  const worker = cluster?.joinCluster(logger);
  if (worker) {
    // The primary started the engine and logged the start; it logs the one "listening" line too.
  } else if (config.embeddedEngine) {
    logger.info(
      { preset: config.embeddedEngine.preset },
      "starting the reference engine (no ACS_MODELS); its weights take a few seconds…",
    );
  } else {
    logger.info(
      { models: config.models.map((m) => m.id), file: config.modelsPath },
      "starting: checking the replicas of each model…",
    );
  }
  if (cluster && !worker) {
    const engine = config.embeddedEngine ? await startEmbeddedEngine(config, logger) : undefined;
    if (config.db === undefined) warnKeysOff(logger, config.host);
    return cluster.runPrimary({
      config,
      workers: config.workers,
      logger,
      engine,
      // Each worker drains (ACS_DRAIN_DELAY_MS) and closes (ACS_SHUTDOWN_GRACE_MS) on its own.
      forceAfterMs: config.drainDelayMs + config.shutdownGraceMs + 15_000,
    });
  }
  const [{ buildApp, createLifecycle, drainAndClose }, embedded] = await Promise.all([
    import("./server/index.js"),
    worker?.embeddedModel
      ? { model: worker.embeddedModel, isAlive: worker.engineAlive, stop: undefined }
      : config.embeddedEngine && !worker
        ? startEmbeddedEngine(config, logger)
        : undefined,
  ]);
  if (config.db === undefined && !worker) warnKeysOff(logger, config.host);
  const models = embedded ? [embedded.model] : config.models;
  const lifecycle = createLifecycle({ graceMs: config.shutdownGraceMs });
  const { app, registry, metrics, flushAccessLog, ops } = await buildApp(
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
  worker?.registerMetrics(metrics);
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
  // The port bound (PORT=0 takes any free one).
  const { address, port, family } = app.server.address() as AddressInfo;
  const url = `http://${family === "IPv6" ? `[${address}]` : address}:${port}`;
  const listening = {
    url,
    port,
    models: registry.status().map((m) => ({
      names: [m.id, ...(models.find((c) => c.id === m.id)?.aliases ?? [])],
      serving: m.serving,
    })),
  };
  if (worker) worker.listening(listening);
  else logger.info(listening, `acs-gateway listening on ${url} (REST, Connect, gRPC-Web, gRPC)`);
  // A worker reports to the primary at least once a second: its ops port (ACS_OPS_PORT) answers
  // from these, and it kills a worker silent for ACS_WORKER_TIMEOUT_MS. A single process serves
  // the ops port on a listening socket of its own.
  if (worker) worker.reportReadiness(ops.readiness);
  if (!worker && config.opsPort !== undefined) {
    const { listenOps, opsListenRefusal } = await import("./server/ops-server.js");
    try {
      const served = await listenOps(ops, { host: config.host, port: config.opsPort, logger });
      logger.info(
        { url: served.url, port: served.port },
        `ops routes (/healthz, /readyz, /metrics) on ${served.url}`,
      );
    } catch (err) {
      refuse(opsListenRefusal(err, config.opsPort, config.host));
    }
  }

  // The first signal drains (ACS_DRAIN_DELAY_MS) and closes (ACS_SHUTDOWN_GRACE_MS); a second one
  // skips what is left of the drain delay and ends the calls in flight at once. Copies of the first
  // (the process group's and npm's; in a worker, the primary's instruction) count once
  // (src/server/shutdown-signals.ts).
  let closing: AbortController | undefined;
  const endNow = (signal: string, from: string) => {
    if (closing === undefined || closing.signal.aborted) return;
    logger.info({ signal, from }, "second signal: ending the calls in flight now");
    closing.abort();
    lifecycle.end();
  };
  const shutdown = (signal: string, from: string) => {
    if (closing !== undefined) return;
    closing = new AbortController();
    logger.info(
      { signal, from, drainDelayMs: config.drainDelayMs, shutdownGraceMs: config.shutdownGraceMs },
      "shutting down",
    );
    // Past the drain delay, the grace and the 5 s linger of build-server, something is stuck.
    // The access lines still waiting for their calls' tokens are written first: the close, which
    // writes them in its last step, has not got there (pino flushes its lines at exit).
    const force = setTimeout(
      () => {
        const waitingAccessLines = flushAccessLog();
        logger.error({ waitingAccessLines }, "shutdown did not finish: exiting");
        process.exit(1);
      },
      config.drainDelayMs + config.shutdownGraceMs + 10_000,
    );
    force.unref();
    drainAndClose(app, lifecycle, { drainDelayMs: config.drainDelayMs, logger, signal: closing.signal }).then(
      () => process.exit(0),
      (err: unknown) => {
        // A hook that failed may have kept the close from writing the waiting access lines.
        const waitingAccessLines = flushAccessLog();
        logger.error({ err, waitingAccessLines }, "close failed");
        process.exit(1);
      },
    );
  };
  onShutdownSignals(logger, {
    drain: (signal) => shutdown(signal, "signal"),
    now: (signal) => endNow(signal, "signal"),
  });
  worker?.onShutdown({
    drain: (signal) => shutdown(signal, "primary"),
    now: (signal) => endNow(signal, "primary"),
  });
}

main().catch((err: unknown) => {
  // A database that cannot be opened (src/config/db-open-error.ts) is the operator's mistake too.
  if (err instanceof ConfigError) refuse(err.message);
  console.error("acs-gateway failed to start:", err);
  process.exit(1);
});
