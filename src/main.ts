// Process entry: loadConfig() → (embedded engine) → buildApp() → listen; SIGTERM/SIGINT → close().
// A mistake in the configuration is one line on stderr and exit code 2; the first log line comes
// before anything slow (the server's modules are imported after it, the engine is started after it).
import { spawn } from "node:child_process";
import type { AddressInfo } from "node:net";
import { extname } from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { type Config, ConfigError, loadConfig, type ModelConfig } from "./config/index.js";

/** Exit code of an operator's mistake (configuration, a port in use): one line on stderr. */
const USAGE_EXIT = 2;

function refuse(message: string): never {
  process.stderr.write(`acs-gateway: ${message}\n`);
  process.exit(USAGE_EXIT);
}

/**
 * Starts the reference engine as a child process on a loopback port (as Inference runs beside the
 * gateway in production): its CPU-bound forward passes and tokenizer then never block the
 * gateway's event loop. Resolves once it listens; the child is killed when this process exits.
 */
async function startEmbeddedEngine(config: Config, logger: pino.Logger) {
  // Only main.ts may start the reference engine; the gateway never imports it otherwise.
  const { getPreset } = await import("./engine/index.js");
  const preset = config.embeddedEngine?.preset ?? "llama-8b";
  const dims = getPreset(preset);
  const entry = fileURLToPath(
    new URL(`./engine/main${extname(fileURLToPath(import.meta.url))}`, import.meta.url),
  );
  const child = spawn(
    process.execPath,
    [...process.execArgv, entry, "--preset", preset, "--port", "0", "--exit-with-stdin"],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  process.on("exit", () => child.kill("SIGTERM"));
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (d: string) => {
      out += d;
      const m = /serving .* at (http:\/\/[^\s]+)/.exec(out);
      if (m?.[1]) resolve(m[1]);
    });
    child.once("exit", (code) => reject(new Error(`reference engine exited with ${code} before listening`)));
  });
  let alive = true;
  child.once("exit", (code, signal) => {
    alive = false;
    logger.error({ code, signal }, "reference engine exited");
  });
  logger.info(
    { url, preset, model: dims.servedModelName, pid: child.pid },
    "reference engine started (no ACS_MODELS)",
  );
  const model: ModelConfig = {
    id: dims.servedModelName,
    aliases: config.embeddedEngine?.aliases ?? [],
    upstreams: [{ url, apiKey: undefined, weight: 1 }],
    servedModelName: dims.servedModelName,
    maxModelLen: undefined, // read from the engine's /v1/models
    hiddenSize: dims.hiddenSize,
    numLayers: dims.numLayers,
    ownedBy: "acs-reference-engine",
  };
  const stop = () =>
    new Promise<void>((resolve) => {
      if (!alive) return resolve();
      child.once("exit", () => resolve());
      child.kill("SIGTERM");
    });
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
  const logger = pino({ level: config.logLevel, name: "acs-gateway" });
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
    return cluster.runPrimary({ config, workers: config.workers, logger, engine });
  }
  const [{ buildApp }, embedded] = await Promise.all([
    import("./server/index.js"),
    worker?.embeddedModel
      ? { model: worker.embeddedModel, isAlive: worker.engineAlive, stop: undefined }
      : config.embeddedEngine && !worker
        ? startEmbeddedEngine(config, logger)
        : undefined,
  ]);
  if (config.db === undefined && !worker) warnKeysOff(logger, config.host);
  const models = embedded ? [embedded.model] : config.models;
  const { app, registry, metrics } = await buildApp(
    { ...config, models, ...(worker ? { instanceId: worker.instanceId } : {}) },
    {
      logger,
      isReady: () => embedded?.isAlive() ?? true,
      ...(embedded?.stop ? { onClose: embedded.stop } : {}),
      ...(worker ? { scrapeMetrics: worker.scrape } : {}),
    },
  );
  worker?.registerMetrics(metrics);
  try {
    await app.listen({ host: config.host, port: config.port });
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

  let closing = false;
  const shutdown = (signal: string) => {
    if (closing) return;
    closing = true;
    logger.info({ signal }, "shutting down");
    const force = setTimeout(() => process.exit(1), 30_000);
    force.unref();
    app.close().then(
      () => process.exit(0),
      (err: unknown) => {
        logger.error({ err }, "close failed");
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", () => shutdown("SIGTERM"));
  process.on("SIGINT", () => shutdown("SIGINT"));
}

main().catch((err: unknown) => {
  console.error("acs-gateway failed to start:", err);
  process.exit(1);
});
