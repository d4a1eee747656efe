import type { FastifyInstance } from "fastify";
import type { Logger } from "pino";
import {
  type BudgetLedger,
  createBudgetLedger,
  DEFAULT_HOLD_TTL_MS,
  DEFAULT_RECLAIM_INTERVAL_MS,
  type UsageLogOptions,
} from "../budget/index.js";
import { type Config, dbOpenError } from "../config/index.js";
import { createSteeringBudget } from "../lens/index.js";
import {
  type Admission,
  admissionLimitsFrom,
  createAdminService,
  createAdmission,
  createCompletionsService,
  createModelRegistry,
  type ModelRegistry,
} from "../service/index.js";
import { buildServer, type ServerDeps } from "../surfaces/http/build-server.js";
import type { Lifecycle } from "../surfaces/http/lifecycle.js";
import {
  type GatewayMetrics,
  registerLedgerMetrics,
  registerUpstreamMetrics,
} from "../surfaces/http/metrics.js";
import type { OnePortTimeouts } from "../surfaces/http/one-port-server.js";
import type { OpsHandlers } from "../surfaces/http/ops-server.js";
import { createTracing, type Tracing } from "../telemetry/index.js";
import {
  createTokenizeCache,
  createUpstreamPool,
  createVllmClient,
  type UpstreamPool,
  type UpstreamPoolOptions,
  VllmInference,
} from "../upstream/index.js";
import { openRateLimits } from "./rate-limits.js";

/**
 * What {@link buildApp} reads of the configuration (src/config), models included: every setting
 * given, as loadConfig resolved it (no default is filled in below it; tests start from
 * test/helpers/config-defaults.ts).
 */
export type AppConfig = Pick<
  Config,
  | "models"
  | "db"
  | "keepaliveIntervalMs"
  | "nonStreamDeadlineMs"
  | "steeringRequestBytes"
  | "steeringProcessBytes"
  | "instanceId"
  | "leaseTtlMs"
  | "holdRenewMs"
  | "playgroundDir"
  | "otlpEndpoint"
  | "lensFanOutConcurrency"
  | "maxRequestsPerKey"
  | "maxStreamsPerKey"
  | "maxUpstreamSharePerKey"
  | "streamStallMs"
  | "upstreamHeadersTimeoutMs"
  | "redisUrl"
  | "workers"
>;

/** Options of {@link buildApp} beyond the configuration. */
export interface AppOptions {
  readonly logger: Logger;
  /** Connection timeouts (tests shorten them). @default defaultOnePortTimeouts */
  readonly timeouts?: Partial<OnePortTimeouts>;
  /** More readiness beyond Inference's health (e.g. an embedded engine is alive). @default () => true */
  readonly isReady?: () => boolean;
  /**
   * How often each replica that is up is checked (`GET /health`), ms; 0 = passive checks only
   * (tests; not configurable). @default the pool's (src/upstream/pool/replica-set.ts)
   */
  readonly healthIntervalMs?: number;
  /** The replica pools' other timings (tests shorten them). @default the pool's defaults */
  readonly pool?: Pick<UpstreamPoolOptions, "checkTimeoutMs" | "backoff" | "failureThreshold">;
  /** Ledger: reclaim timer interval, ms (0 = off). @default the ledger's default */
  readonly reclaimIntervalMs?: number;
  /** Ledger: the usage log's batching (tests lengthen its flush interval). @default the log's defaults */
  readonly usageLog?: UsageLogOptions;
  /** Runs last in app.close(), after the gateway's own resources are closed. */
  readonly onClose?: () => Promise<void>;
  /**
   * Drain and shutdown (src/surfaces/http/lifecycle.ts; src/app/gateway-process.ts makes one with
   * ACS_SHUTDOWN_GRACE_MS).
   * @default a lifecycle with no grace: app.close() ends the calls in flight at once
   */
  readonly lifecycle?: Lifecycle;
  /**
   * Spans and `traceparent` propagation (src/telemetry; tests pass one with an in-memory exporter).
   * @default createTracing({ otlpTracesUrl: config.otlpEndpoint })
   */
  readonly tracing?: Tracing;
  /** What GET /metrics answers, given the app's registry (cluster workers). @default its own */
  readonly scrapeMetrics?: ServerDeps["scrapeMetrics"];
  /**
   * The per-key caps' counts (a cluster worker's ask the primary, src/app/cluster/).
   * @default createAdmission with the configuration's caps: this process's own counts
   */
  readonly admission?: Admission;
}

/** A built gateway, not yet listening. */
export interface App {
  readonly app: FastifyInstance;
  readonly metrics: GatewayMetrics;
  readonly registry: ModelRegistry<VllmInference<UpstreamPool>>;
  /** The Budget ledger; undefined with keys off. */
  readonly ledger: BudgetLedger | undefined;
  /** Per-key requests in flight and their caps (used with keys on). */
  readonly admission: Admission;
  /**
   * Writes now the access lines still waiting for their calls' tokens (callers gone while the
   * service runs the call), as app.close() does in its last step; returns how many. For a forced
   * exit, which does not wait for the close (src/app/process-shutdown.ts).
   */
  readonly flushAccessLog: () => number;
  /** What GET /healthz, /readyz and /metrics answer: also served on the ops port (ACS_OPS_PORT). */
  readonly ops: OpsHandlers;
}

/**
 * The one wiring of the gateway, used by src/app/gateway-process.ts and by the tests alike: a
 * replica pool per model (src/upstream/pool: one Inference client per replica, sharing one
 * /tokenize cache), the model registry (max_model_len read from Inference where the models file
 * leaves it out), the Budget ledger when `db` is set (SQLite, or PostgreSQL shared by replicas:
 * see {@link openLedger}), the steering budget (its gauges on /metrics), the completions service,
 * and the server with its REST, Connect, gRPC-Web, gRPC and ops routes. `app.close()` closes the pools and the ledger.
 *
 * Resolves once every replica has had its first check: a model none of whose replicas answers (or
 * that serve another model) is logged and served when one does; the others serve at once.
 * Readiness (`/readyz`, gRPC health): a model serves while one of its replicas is up; the gateway
 * while one model serves, `options.isReady()` and the ledger (if any) can write.
 */
export async function buildApp(config: AppConfig, options: AppOptions): Promise<App> {
  const { logger } = options;
  const { registry, pools, closePools } = createPools(config, options);
  await Promise.all(pools.map(({ pool }) => pool.ready()));
  warnUnserved(registry, logger);

  let ledger: BudgetLedger | undefined;
  try {
    ledger = await openLedger(config, logger, options.reclaimIntervalMs, options.usageLog);
  } catch (err) {
    await closePools();
    // No server, no such database, a login refused, not a database: one line for the operator.
    throw (config.db && dbOpenError(err, config.db)) ?? err;
  }

  const steeringBudget = createSteeringBudget({
    requestBytes: config.steeringRequestBytes,
    processBytes: config.steeringProcessBytes,
  });
  const admission = options.admission ?? createAdmission(admissionLimitsFrom(config));
  // Rate limits are a key's: with keys off there is nothing to limit.
  const rateLimits = ledger === undefined ? undefined : await openRateLimits(config, logger);
  const api = createCompletionsService({
    models: registry,
    ledger,
    usageLog: ledger?.usageLog,
    rateLimits,
    nonStreamDeadlineMs: config.nonStreamDeadlineMs,
    holdRenewIntervalMs: config.holdRenewMs,
    onLedgerError: (err) => logger.error({ err }, "Budget ledger call failed"),
    steeringBudget,
    lensFanOutConcurrency: config.lensFanOutConcurrency,
    admission,
  });
  const notReady = notReadyReasons(options.isReady ?? (() => true), registry, ledger);
  const { app, metrics, flushAccessLog, ops } = await buildServer({
    config,
    api,
    // With keys off the admin API answers 404 `unknown_route` saying so (no keys to administer).
    admin: createAdminService(ledger),
    logger,
    isReady: () => notReady().length === 0,
    notReadyReasons: notReady,
    modelStatus: () => registry.status(),
    steeringBudget,
    ...(config.playgroundDir === undefined ? {} : { playgroundDir: config.playgroundDir }),
    tracing: options.tracing ?? createTracing({ otlpTracesUrl: config.otlpEndpoint }),
    ...(options.timeouts ? { timeouts: options.timeouts } : {}),
    ...(options.lifecycle ? { lifecycle: options.lifecycle } : {}),
    ...(options.scrapeMetrics ? { scrapeMetrics: options.scrapeMetrics } : {}),
    onClose: async () => {
      await closePools();
      await ledger?.close();
      await rateLimits?.close();
      await options.onClose?.();
    },
  });
  registerUpstreamMetrics(metrics.registry, pools);
  if (ledger !== undefined) registerLedgerMetrics(metrics.registry, ledger);
  return { app, metrics, registry, ledger, admission, flushAccessLog, ops };
}

/** Every model's replica pool, as the registry creates them; `closePools` closes each once. */
interface Pools {
  readonly registry: ModelRegistry<VllmInference<UpstreamPool>>;
  readonly pools: Array<{ model: string; pool: UpstreamPool }>;
  readonly closePools: () => Promise<void>;
}

/**
 * The model registry, and a replica pool per model (one Inference client per replica, sharing one
 * /tokenize cache), checked every `options.healthIntervalMs` (default: the pool's).
 */
function createPools(config: AppConfig, options: AppOptions): Pools {
  const pools: Array<{ model: string; pool: UpstreamPool }> = [];
  const registry = createModelRegistry(config.models, (m, admit) => {
    const tokenizeCache = createTokenizeCache();
    const pool = createUpstreamPool({
      model: m.id,
      replicas: m.upstreams.map((u) => ({
        url: u.url,
        weight: u.weight,
        client: createVllmClient({
          baseUrl: u.url,
          tokenizeCache,
          silenceTimeoutMs: config.upstreamHeadersTimeoutMs,
          ...(u.apiKey === undefined ? {} : { apiKey: u.apiKey }),
          ...(m.maxConcurrentRequests === undefined ? {} : { connections: m.maxConcurrentRequests }),
        }),
      })),
      admit,
      ...(options.healthIntervalMs === undefined ? {} : { healthIntervalMs: options.healthIntervalMs }),
      ...options.pool,
      logger: options.logger,
    });
    pools.push({ model: m.id, pool });
    return new VllmInference(pool);
  });
  const closePools = async () => {
    await Promise.all(pools.splice(0).map(({ pool }) => pool.close()));
  };
  return { registry, pools, closePools };
}

/** One warning per model none of whose replicas is up after the first checks. */
function warnUnserved(registry: ModelRegistry<VllmInference<UpstreamPool>>, logger: Logger): void {
  for (const s of registry.status()) {
    if (!s.serving) {
      logger.warn(
        { model: s.id },
        `model ${s.id} is not served yet: no replica is up (each is checked again with backoff)`,
      );
    }
  }
}

/** Why the gateway is not ready (GET /readyz's `reasons`); empty when it is. */
function notReadyReasons(
  isReady: () => boolean,
  registry: ModelRegistry<VllmInference<UpstreamPool>>,
  ledger: BudgetLedger | undefined,
): () => string[] {
  return () => {
    const reasons: string[] = [];
    if (!isReady()) reasons.push("the embedded reference engine is not running");
    if (!registry.status().some((m) => m.serving)) reasons.push("no model serves: no replica is up");
    // Not ready while the ledger cannot write (a full disk, PostgreSQL unreachable): a load
    // balancer sends the traffic elsewhere until its settles are written (src/budget/README.md).
    if (ledger !== undefined && !ledger.writable) reasons.push(LEDGER_NOT_WRITABLE);
    return reasons;
  };
}

/** GET /readyz's reason while the Budget ledger cannot write (src/budget/README.md, "When the store fails"). */
export const LEDGER_NOT_WRITABLE =
  "the Budget ledger cannot write: its store failed a write, or settles it failed are still waiting to be written";

/**
 * The Budget ledger of `config.db`, or undefined without one. Holds outlive the longest
 * non-streamed wait (streams renew theirs). SQLite: one transaction per Hold; at start it releases
 * the Holds an earlier run left (all of them, or only this instance's with ACS_INSTANCE_ID).
 * PostgreSQL: Holds from leases (src/budget/README.md); at start it releases what this instance's
 * earlier run left when ACS_INSTANCE_ID names it, else nothing (the other replicas reclaim a dead
 * one's after expiry).
 */
async function openLedger(
  config: AppConfig,
  logger: Logger,
  reclaimIntervalMs: number | undefined,
  usageLog: UsageLogOptions | undefined,
): Promise<BudgetLedger | undefined> {
  const { db } = config;
  if (db === undefined) return undefined;
  const { leaseTtlMs } = config;
  // On a shared database a dead replica's leases come back within two lease lifetimes.
  const reclaimEvery =
    reclaimIntervalMs ??
    (db.kind === "postgres"
      ? Math.min(DEFAULT_RECLAIM_INTERVAL_MS, leaseTtlMs)
      : DEFAULT_RECLAIM_INTERVAL_MS);
  const ledger = await createBudgetLedger({
    ...(db.kind === "postgres" ? { postgresUrl: db.url } : { path: db.path }),
    holdTtlMs: Math.max(DEFAULT_HOLD_TTL_MS, config.nonStreamDeadlineMs + 60_000),
    leases: db.kind === "postgres" && { ttlMs: leaseTtlMs },
    ...(config.instanceId === undefined ? {} : { instanceId: config.instanceId }),
    reclaimIntervalMs: reclaimEvery,
    ...(usageLog === undefined ? {} : { usageLog }),
    onReclaimError: (err) => logger.error({ err }, "Budget ledger background task failed"),
    onWritableChange: ({ writable, pendingSettles, pendingTokens, error }) => {
      if (writable) logger.info("Budget ledger writes again: every pending settle is written; ready");
      else {
        logger.error(
          { err: error, pendingSettles, pendingTokens },
          "Budget ledger cannot write: not ready; failed settles are kept and written again",
        );
      }
    },
  });
  try {
    const scope = config.instanceId !== undefined ? "instance" : db.kind === "sqlite" ? "all" : undefined;
    const reclaimed = scope === undefined ? { holds: 0, leases: 0 } : await ledger.reclaimOnStart(scope);
    logger.info(
      { db: db.kind === "sqlite" ? db.path : "postgres", instanceId: ledger.instanceId, reclaimed },
      "keys and Budgets on",
    );
    return ledger;
  } catch (err) {
    await ledger.close();
    throw err;
  }
}
