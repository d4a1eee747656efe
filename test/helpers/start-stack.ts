// Real servers on loopback for integration tests: the reference engine (or any upstream URL),
// and the gateway built by buildApp — the wiring src/main.ts uses — listening on 127.0.0.1:0.
import type { AddressInfo, Server } from "node:net";
import type { FastifyInstance } from "fastify";
import { pino } from "pino";
import type { Registry } from "prom-client";
import { type AppOptions, buildApp, type Lifecycle, type OnePortTimeouts } from "../../src/app/index.js";
import type { BudgetLedger } from "../../src/budget/index.js";
import type { BudgetDb, ModelConfig } from "../../src/config/index.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import type { Admission, ModelRegistry } from "../../src/service/index.js";
import type { UpstreamPool, VllmInference } from "../../src/upstream/index.js";
import { configDefaults } from "./config-defaults.js";

export interface StackOptions {
  /** Engine preset. @default "tiny" */
  preset?: "tiny" | "llama-8b";
  /** Use this upstream instead of starting an engine (fault tests). */
  upstreamUrl?: string;
  /** Use these replicas instead of starting an engine (several upstreams of one model). */
  upstreams?: Array<{ url: string; weight?: number; apiKey?: string }>;
  /** Facts of the model when upstreamUrl or upstreams is set. */
  model?: Partial<ModelConfig>;
  /** More models served by the same upstream (each its own id; no aliases unless given). */
  extraModels?: Array<Partial<ModelConfig> & { id: string }>;
  /** Replica checks: `/health` interval while up (ms, 0 = passive only). @default 0 */
  healthIntervalMs?: number;
  /** Replica pool timings. @default the pool's */
  pool?: AppOptions["pool"];
  /** SQLite file: keys and Budgets on. */
  dbPath?: string;
  /** Keys and Budgets on another store (PostgreSQL); wins over dbPath. */
  db?: BudgetDb;
  keepaliveIntervalMs?: number;
  nonStreamDeadlineMs?: number;
  timeouts?: Partial<OnePortTimeouts>;
  /** Bounds of the steering budget, bytes (default: the config's defaults). */
  steeringRequestBytes?: number;
  steeringProcessBytes?: number;
  /** The built playground page served at GET /playground. @default dist/playground */
  playgroundDir?: string;
  /** Drain and shutdown (src/surfaces/http/lifecycle.ts). @default none: close() ends calls at once */
  lifecycle?: Lifecycle;
  /** The gateway's logger (tests read the access log from its destination). @default silent */
  logger?: AppOptions["logger"];
  /** The gateway's tracing (tests: an in-memory exporter). @default none recorded */
  tracing?: AppOptions["tracing"];
  /** Inference requests one lens fan-out runs at once (default: the config's default). */
  lensFanOutConcurrency?: number;
  /** Per-key caps (default: the config's defaults; 0 = no cap for the counts). */
  maxRequestsPerKey?: number;
  maxStreamsPerKey?: number;
  maxUpstreamSharePerKey?: number;
  /** A stream whose caller has not read for this long is ended, ms (default: the config's). */
  streamStallMs?: number;
  /** Longest wait for an upstream answer's first event, ms (default: the config's). */
  upstreamHeadersTimeoutMs?: number;
  /** The ledger's usage log batching (e.g. a long flush interval). @default the log's */
  usageLog?: AppOptions["usageLog"];
  /** ACS_REDIS_URL: the rate limits' Redis (test/helpers/redis.ts); unset: this process's memory. */
  redisUrl?: string;
}

export interface Stack {
  /** http://127.0.0.1:PORT of the gateway. */
  url: string;
  /** The gateway's listening server (its 'connection' events give the server side of a socket). */
  server: Server;
  /** The gateway app (drainAndClose takes it). */
  app: FastifyInstance;
  engine: RunningEngine | undefined;
  ledger: BudgetLedger | undefined;
  /** The gateway's models and their replica pools. */
  registry: ModelRegistry<VllmInference<UpstreamPool>>;
  /** Per-key requests in flight (keys on). */
  admission: Admission;
  /** The gateway's metrics registry (what GET /metrics serves), still readable after close(). */
  metrics: Registry;
  /** The model id and alias the stack serves. */
  modelId: string;
  alias: string;
  close(): Promise<void>;
}

/**
 * Starts engine (unless upstreamUrl or upstreams) + gateway; close() stops both and waits for
 * connections to drain.
 */
export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  const scripted = opts.upstreamUrl !== undefined || opts.upstreams !== undefined;
  const engine = scripted ? undefined : await startEngine({ preset: opts.preset ?? "tiny" });
  const upstreams = (opts.upstreams ?? [{ url: engine?.url ?? opts.upstreamUrl ?? "" }]).map((u) => ({
    url: u.url,
    apiKey: u.apiKey,
    weight: u.weight ?? 1,
  }));
  const alias = opts.preset === "llama-8b" ? "llama-8b" : "tiny";
  const modelConfig: ModelConfig = {
    id: engine?.model.id ?? "acs/fake",
    aliases: [alias],
    upstreams,
    servedModelName: engine?.model.id ?? "acs/fake",
    maxModelLen: engine?.model.maxModelLen ?? 512,
    hiddenSize: engine?.model.hiddenSize ?? 64,
    numLayers: engine?.model.numLayers ?? 4,
    ownedBy: "acs-test",
    ...opts.model,
  };
  const { app, ledger, registry, admission, metrics } = await buildApp(
    {
      // Every setting at its default (the schema's), then the test's own.
      ...configDefaults,
      models: [modelConfig, ...(opts.extraModels ?? []).map((m) => ({ ...modelConfig, aliases: [], ...m }))],
      db: opts.db ?? (opts.dbPath === undefined ? undefined : { kind: "sqlite", path: opts.dbPath }),
      ...(opts.keepaliveIntervalMs === undefined ? {} : { keepaliveIntervalMs: opts.keepaliveIntervalMs }),
      ...(opts.nonStreamDeadlineMs === undefined ? {} : { nonStreamDeadlineMs: opts.nonStreamDeadlineMs }),
      ...(opts.steeringRequestBytes === undefined ? {} : { steeringRequestBytes: opts.steeringRequestBytes }),
      ...(opts.steeringProcessBytes === undefined ? {} : { steeringProcessBytes: opts.steeringProcessBytes }),
      ...(opts.playgroundDir === undefined ? {} : { playgroundDir: opts.playgroundDir }),
      ...(opts.lensFanOutConcurrency === undefined
        ? {}
        : { lensFanOutConcurrency: opts.lensFanOutConcurrency }),
      ...(opts.maxRequestsPerKey === undefined ? {} : { maxRequestsPerKey: opts.maxRequestsPerKey }),
      ...(opts.maxStreamsPerKey === undefined ? {} : { maxStreamsPerKey: opts.maxStreamsPerKey }),
      ...(opts.maxUpstreamSharePerKey === undefined
        ? {}
        : { maxUpstreamSharePerKey: opts.maxUpstreamSharePerKey }),
      ...(opts.streamStallMs === undefined ? {} : { streamStallMs: opts.streamStallMs }),
      ...(opts.upstreamHeadersTimeoutMs === undefined
        ? {}
        : { upstreamHeadersTimeoutMs: opts.upstreamHeadersTimeoutMs }),
      ...(opts.redisUrl === undefined ? {} : { redisUrl: opts.redisUrl }),
    },
    {
      logger: opts.logger ?? pino({ level: "silent" }),
      ...(opts.tracing ? { tracing: opts.tracing } : {}),
      healthIntervalMs: opts.healthIntervalMs ?? 0,
      reclaimIntervalMs: 0,
      ...(opts.usageLog ? { usageLog: opts.usageLog } : {}),
      ...(opts.pool ? { pool: opts.pool } : {}),
      ...(opts.timeouts ? { timeouts: opts.timeouts } : {}),
      ...(opts.lifecycle ? { lifecycle: opts.lifecycle } : {}),
    },
  );
  await app.listen({ host: "127.0.0.1", port: 0 });
  const port = (app.server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    server: app.server,
    app,
    engine,
    ledger,
    registry,
    admission,
    metrics: metrics.registry,
    modelId: modelConfig.id,
    alias,
    async close() {
      await app.close();
      await engine?.close();
    },
  };
}
