// Process entry: loadConfig() → (embedded engine) → buildServer() → listen; SIGTERM/SIGINT → close().
import { pino } from "pino";
import { createBudgetLedger } from "./budget/index.js";
import { type Config, ConfigError, loadConfig, type ModelConfig } from "./config/index.js";
import { buildServer } from "./server/index.js";
import { createCompletionsService, createModelRegistry } from "./service/index.js";
import { createVllmClient, type VllmClient } from "./upstream/index.js";

async function startEmbeddedEngine(config: Config, logger: pino.Logger) {
  // Only main.ts may start the reference engine; the gateway never imports it otherwise.
  const { startEngine } = await import("./engine/index.js");
  const preset = config.embeddedEngine?.preset ?? "llama-8b";
  const engine = await startEngine({ preset, host: "127.0.0.1", port: 0 });
  logger.info(
    { url: engine.url, preset, model: engine.model.id },
    "reference engine started (no ACS_MODELS)",
  );
  const model: ModelConfig = {
    id: engine.model.id,
    aliases: config.embeddedEngine?.aliases ?? [],
    upstreamUrl: engine.url,
    servedModelName: engine.model.id,
    upstreamApiKey: undefined,
    maxModelLen: engine.model.maxModelLen,
    hiddenSize: engine.model.hiddenSize,
    numLayers: engine.model.numLayers,
    ownedBy: "acs-reference-engine",
  };
  return { engine, model };
}

async function main(): Promise<void> {
  let config: Config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`acs-gateway: ${err.message}`);
      process.exit(2);
    }
    throw err;
  }
  const logger = pino({ level: config.logLevel, name: "acs-gateway" });
  const embedded = config.embeddedEngine ? await startEmbeddedEngine(config, logger) : undefined;
  const modelConfigs = embedded ? [embedded.model] : config.models;

  const clients: VllmClient[] = [];
  const clientFor = (m: ModelConfig) => {
    const client = createVllmClient({
      baseUrl: m.upstreamUrl,
      ...(m.upstreamApiKey === undefined ? {} : { apiKey: m.upstreamApiKey }),
    });
    clients.push(client);
    return client;
  };

  // Inference may still be starting: retry until every model's facts are known.
  let registry: Awaited<ReturnType<typeof createModelRegistry<VllmClient>>> | undefined;
  for (let attempt = 1; registry === undefined; attempt++) {
    try {
      registry = await createModelRegistry(modelConfigs, clientFor);
    } catch (err) {
      for (const c of clients.splice(0)) await c.close();
      logger.warn({ err: (err as Error).message, attempt }, "Inference not ready; retrying in 2 s");
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  const ledger = config.dbPath === undefined ? undefined : createBudgetLedger({ path: config.dbPath });
  if (ledger) {
    const reclaimed = ledger.reclaimOnStart();
    logger.info({ db: config.dbPath, reclaimed }, "keys and Budgets on");
  } else {
    logger.warn(
      { host: config.host },
      "ACS_DB is not set: authentication and Budgets are OFF (loopback only)",
    );
  }

  const api = createCompletionsService({
    models: registry,
    ledger,
    nonStreamDeadlineMs: config.nonStreamDeadlineMs,
  });
  const { app } = await buildServer({
    config,
    api,
    logger,
    isReady: () => true,
    onClose: async () => {
      for (const c of clients) await c.close();
      ledger?.close();
      await embedded?.engine.close();
    },
  });
  await app.listen({ host: config.host, port: config.port });
  logger.info(
    { url: `http://${config.host}:${config.port}`, models: registry.list().map((m) => [m.id, ...m.aliases]) },
    "acs-gateway listening (REST, Connect, gRPC-Web, gRPC)",
  );

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
