// Process entry: loadConfig() → run the single process, the cluster's primary (ACS_WORKERS > 1,
// src/app/cluster/) or one of its workers. A gateway process (src/app/gateway-process.ts):
// (embedded engine) → buildApp() → listen; SIGTERM/SIGINT → drain and close (src/surfaces/http/lifecycle.ts).
// A mistake in the configuration (a keys database that cannot be opened too) is one line on stderr
// and exit code 2; the first log line comes before anything slow (the server's modules are
// imported after it, the engine is started after it).
import { extname } from "node:path";
import { fileURLToPath } from "node:url";
import type { pino } from "pino";
import type { ClusterWorker } from "./app/cluster/index.js";
import { type EngineProgram, startEmbeddedEngine } from "./app/embedded-engine.js";
import { refuse, warnKeysOff } from "./app/operator-lines.js";
import { type Config, ConfigError, loadConfig } from "./config/index.js";
import { createLogger } from "./telemetry/logger.js";

/** src/app/cluster/, imported only with ACS_WORKERS > 1. */
type Cluster = typeof import("./app/cluster/index.js");

/** The reference engine's preset and main file: only main.ts imports src/engine (its presets). */
async function engineProgram(config: Config): Promise<EngineProgram> {
  const { getPreset } = await import("./engine/index.js");
  const preset = config.embeddedEngine?.preset ?? "llama-8b";
  const dims = getPreset(preset);
  // The engine's own extension: dist/src/engine/main.js under `npm start`, .ts under tsx.
  const entry = fileURLToPath(
    new URL(`./engine/main${extname(fileURLToPath(import.meta.url))}`, import.meta.url),
  );
  return { preset, dims, entry };
}

/** Starts the embedded reference engine (src/app/embedded-engine.ts). */
async function startEngine(config: Config, logger: pino.Logger) {
  return startEmbeddedEngine(config, logger, await engineProgram(config));
}

function readConfig(): Config {
  try {
    return loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) refuse(err.message);
    throw err;
  }
}

/** The first log line: what this process starts with (a worker's primary has said it). */
function logStart(config: Config, logger: pino.Logger, worker: ClusterWorker | undefined): void {
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
}

/** ACS_WORKERS > 1, this process the primary: the engine (if any) here, the gateway in the workers. */
async function runPrimary(cluster: Cluster, config: Config, logger: pino.Logger): Promise<never> {
  const engine = config.embeddedEngine ? await startEngine(config, logger) : undefined;
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

async function main(): Promise<void> {
  const config = readConfig();
  const logger = createLogger({ level: config.logLevel, format: config.logFormat });
  // ACS_WORKERS > 1: this process is the cluster's primary, or one of its workers (src/app/cluster/).
  const cluster = config.workers > 1 ? await import("./app/cluster/index.js") : undefined;
  const worker = cluster?.joinCluster(logger);
  logStart(config, logger, worker);
  if (cluster && !worker) return runPrimary(cluster, config, logger);
  const [{ runGateway }, embedded] = await Promise.all([
    import("./app/gateway-process.js"),
    worker?.embeddedModel
      ? { model: worker.embeddedModel, isAlive: worker.engineAlive, stop: undefined }
      : config.embeddedEngine && !worker
        ? startEngine(config, logger)
        : undefined,
  ]);
  await runGateway({ config, logger, worker, embedded });
}

main().catch((err: unknown) => {
  // A database that cannot be opened (src/config/db-open-error.ts) is the operator's mistake too.
  if (err instanceof ConfigError) refuse(err.message);
  console.error("acs-gateway failed to start:", err);
  process.exit(1);
});
