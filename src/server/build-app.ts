import type { FastifyInstance } from "fastify";
import type { Logger } from "pino";
import { type BudgetLedger, createBudgetLedger, DEFAULT_HOLD_TTL_MS } from "../budget/index.js";
import type { Config } from "../config/index.js";
import { createSteeringBudget } from "../lens/index.js";
import { createCompletionsService, createModelRegistry, type ModelRegistry } from "../service/index.js";
import { createVllmClient, type VllmClient } from "../upstream/index.js";
import { buildServer } from "./build-server.js";
import type { GatewayMetrics } from "./metrics.js";
import type { OnePortTimeouts } from "./one-port-server.js";

/**
 * What {@link buildApp} reads of the configuration (src/config), models included; the steering
 * budget's bounds default to the lens defaults (32 MiB per request, 256 MiB in all).
 */
export type AppConfig = Pick<Config, "models" | "dbPath" | "keepaliveIntervalMs" | "nonStreamDeadlineMs"> &
  Partial<Pick<Config, "steeringRequestBytes" | "steeringProcessBytes">>;

/** Options of {@link buildApp} beyond the configuration. */
export interface AppOptions {
  readonly logger: Logger;
  /** Connection timeouts (tests shorten them). @default defaultOnePortTimeouts */
  readonly timeouts?: Partial<OnePortTimeouts>;
  /** More readiness beyond Inference's health (e.g. an embedded engine is alive). @default () => true */
  readonly isReady?: () => boolean;
  /**
   * Wait for Inference when it does not answer at start: retry every this many ms until every
   * model's facts are known. Undefined: fail at once (tests).
   */
  readonly retryInferenceMs?: number;
  /** How often Inference's `/health` is polled for readiness, ms; 0 turns polling off. @default 5000 */
  readonly healthIntervalMs?: number;
  /** Ledger: reclaim timer interval, ms (0 = off). @default the ledger's default */
  readonly reclaimIntervalMs?: number;
  /** Runs last in app.close(), after the gateway's own resources are closed. */
  readonly onClose?: () => Promise<void>;
}

/** A built gateway, not yet listening. */
export interface App {
  readonly app: FastifyInstance;
  readonly metrics: GatewayMetrics;
  readonly registry: ModelRegistry<VllmClient>;
  /** The Budget ledger; undefined with keys off. */
  readonly ledger: BudgetLedger | undefined;
}

/**
 * The one wiring of the gateway, used by src/main.ts and by the tests alike: an Inference client
 * per model, the model registry (max_model_len read from Inference where the models file leaves it
 * out), the Budget ledger when `dbPath` is set (its Holds outlive the longest non-streamed wait;
 * Holds left by an earlier run are released), the steering budget (its gauges on /metrics), the
 * completions service, and the server with its
 * REST, Connect, gRPC-Web, gRPC and ops routes. `app.close()` closes the clients and the ledger.
 * Readiness (`/readyz`, gRPC health) follows Inference's `/health` and `options.isReady`.
 *
 * Throws when Inference does not serve a configured model (unless `retryInferenceMs` is set).
 */
export async function buildApp(config: AppConfig, options: AppOptions): Promise<App> {
  const { logger } = options;
  const clients: VllmClient[] = [];
  const clientFor = (m: Config["models"][number]) => {
    const client = createVllmClient({
      baseUrl: m.upstreamUrl,
      ...(m.upstreamApiKey === undefined ? {} : { apiKey: m.upstreamApiKey }),
    });
    clients.push(client);
    return client;
  };
  const closeClients = async () => {
    for (const c of clients.splice(0)) await c.close();
  };

  let registry: ModelRegistry<VllmClient> | undefined;
  for (let attempt = 1; registry === undefined; attempt++) {
    try {
      registry = await createModelRegistry(config.models, clientFor);
    } catch (err) {
      await closeClients();
      if (options.retryInferenceMs === undefined) throw err;
      logger.warn(
        { err: (err as Error).message, attempt },
        `Inference not ready; retrying in ${options.retryInferenceMs} ms`,
      );
      await new Promise((r) => setTimeout(r, options.retryInferenceMs));
    }
  }

  // A Hold outlives the longest non-streamed wait (streams renew theirs).
  const holdTtlMs = Math.max(DEFAULT_HOLD_TTL_MS, config.nonStreamDeadlineMs + 60_000);
  const ledger =
    config.dbPath === undefined
      ? undefined
      : createBudgetLedger({
          path: config.dbPath,
          holdTtlMs,
          ...(options.reclaimIntervalMs === undefined
            ? {}
            : { reclaimIntervalMs: options.reclaimIntervalMs }),
        });
  if (ledger) {
    const reclaimed = ledger.reclaimOnStart();
    logger.info({ db: config.dbPath, reclaimed }, "keys and Budgets on");
  }

  // Readiness follows Inference: /readyz and gRPC health say NOT_SERVING while any is down.
  let inferenceHealthy = true;
  const healthIntervalMs = options.healthIntervalMs ?? 5000;
  const healthTimer =
    healthIntervalMs > 0
      ? setInterval(() => {
          void Promise.all(clients.map((c) => c.health())).then((ok) => {
            const healthy = ok.every(Boolean);
            if (healthy !== inferenceHealthy) logger.warn({ healthy }, "Inference health changed");
            inferenceHealthy = healthy;
          });
        }, healthIntervalMs)
      : undefined;
  healthTimer?.unref();

  const steeringBudget = createSteeringBudget({
    ...(config.steeringRequestBytes === undefined ? {} : { requestBytes: config.steeringRequestBytes }),
    ...(config.steeringProcessBytes === undefined ? {} : { processBytes: config.steeringProcessBytes }),
  });
  const api = createCompletionsService({
    models: registry,
    ledger,
    nonStreamDeadlineMs: config.nonStreamDeadlineMs,
    onLedgerError: (err) => logger.error({ err }, "Budget ledger call failed"),
    steeringBudget,
  });
  const isReady = options.isReady ?? (() => true);
  const { app, metrics } = await buildServer({
    config,
    api,
    logger,
    isReady: () => inferenceHealthy && isReady(),
    steeringBudget,
    ...(options.timeouts ? { timeouts: options.timeouts } : {}),
    onClose: async () => {
      if (healthTimer) clearInterval(healthTimer);
      await closeClients();
      ledger?.close();
      await options.onClose?.();
    },
  });
  return { app, metrics, registry, ledger };
}
