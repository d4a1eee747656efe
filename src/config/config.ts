import { readFileSync } from "node:fs";
import { checkDbPath } from "./check-db-path.js";
import { ConfigError } from "./config-error.js";
import { type LogLevel, parseEnv } from "./env-schema.js";
import { limits } from "./limits.js";
import type { ModelConfig } from "./model-config.js";
import { parseModelsFile } from "./models-file.js";

export { limits };

/** The embedded reference engine that `npm start` runs when no models file is given. */
export interface EmbeddedEngineConfig {
  /** Engine preset (src/engine). @default "llama-8b" */
  readonly preset: "tiny" | "llama-8b";
  /** Aliases of the embedded model. @default ["llama-8b"] for that preset */
  readonly aliases: readonly string[];
}

/**
 * Where keys and Budgets live (env ACS_DB): a SQLite file (the embedded default, one gateway
 * process) or a PostgreSQL database shared by gateway replicas (`postgres://` or `postgresql://`).
 */
export type BudgetDb =
  | { readonly kind: "sqlite"; readonly path: string }
  | { readonly kind: "postgres"; readonly url: string };

/** The whole configuration, parsed once at start (nothing else reads process.env). */
export interface Config {
  /** Bind address. @default "127.0.0.1" (env HOST) */
  readonly host: string;
  /** TCP port for REST, Connect, gRPC-Web and gRPC; 0 = any free port. @default 8080 (env PORT) */
  readonly port: number;
  /**
   * A second TCP port (on HOST) serving only GET /healthz, /readyz and /metrics, answered by the
   * cluster's primary with ACS_WORKERS > 1: probes that never queue behind the callers'
   * connections. 0 = any free port; undefined = none (the ops routes stay on PORT either way).
   * (env ACS_OPS_PORT)
   */
  readonly opsPort: number | undefined;
  /** Served models (env ACS_MODELS = path of a JSON models file); empty with an embedded engine. */
  readonly models: readonly ModelConfig[];
  /** The models file, when one is given (env ACS_MODELS). */
  readonly modelsPath: string | undefined;
  /** Set when the gateway starts the reference engine itself (no ACS_MODELS). */
  readonly embeddedEngine: EmbeddedEngineConfig | undefined;
  /** Database of keys and Budgets; undefined = authentication off (loopback only). (env ACS_DB) */
  readonly db: BudgetDb | undefined;
  /**
   * This replica's stable name in the shared database, so that a restart releases the Holds and
   * leases its previous run left at once (else they expire). (env ACS_INSTANCE_ID)
   */
  readonly instanceId: string | undefined;
  /** How long a replica's lease outlives its last sync (a dead replica's is reclaimed after it), ms. @default 30000 (env ACS_LEASE_TTL_MS) */
  readonly leaseTtlMs: number;
  /** How often a stream renews its Hold, recording the tokens generated so far, ms. @default 10000 (env ACS_HOLD_RENEW_MS) */
  readonly holdRenewMs: number;
  /** SSE `: keepalive` interval, ms. @default 5000 (env ACS_KEEPALIVE_MS) */
  readonly keepaliveIntervalMs: number;
  /** Longest wait for a non-streamed answer, ms. @default 840000 (14 min) (env ACS_DEADLINE_MS) */
  readonly nonStreamDeadlineMs: number;
  /** pino level. @default "info" (env ACS_LOG_LEVEL) */
  readonly logLevel: LogLevel;
  /** Log lines as JSON (one object a line) or `pretty` (pino-pretty, for people). @default "json" (env ACS_LOG_FORMAT) */
  readonly logFormat: "json" | "pretty";
  /**
   * The OTLP/HTTP URL OpenTelemetry spans are exported to; undefined = none exported (the
   * `traceparent` header is still passed on). (env OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is,
   * else OTEL_EXPORTER_OTLP_ENDPOINT + `/v1/traces`, as the OpenTelemetry specification says)
   */
  readonly otlpEndpoint: string | undefined;
  /**
   * Most bytes of decoded steering tensors one request may hold (elements × 2 or 4 bytes, whatever
   * the compression); more → 413 `request_too_large`. @default 33554432 (32 MiB: 2^23 float32)
   * (env ACS_STEERING_REQUEST_BYTES)
   */
  readonly steeringRequestBytes: number;
  /**
   * Most bytes of decoded steering tensors all requests in flight may hold together; past it →
   * 429 `rate_limited` with `Retry-After: 1`. @default 268435456 (256 MiB) (env ACS_STEERING_PROCESS_BYTES)
   */
  readonly steeringProcessBytes: number;
  /**
   * The built playground page served at GET /playground (`npm run build:playground` writes it).
   * @default dist/playground of the package (env ACS_PLAYGROUND_DIR)
   */
  readonly playgroundDir: string | undefined;
  /**
   * After SIGTERM/SIGINT, how long the gateway reports not ready (`/readyz` 503, gRPC health
   * NOT_SERVING) while still accepting and serving, so that load balancers stop sending first, ms.
   * @default 5000 (env ACS_DRAIN_DELAY_MS)
   */
  readonly drainDelayMs: number;
  /**
   * Once it stops accepting, how long calls in flight (unary and streams, every protocol) may go on
   * before they end with the shutdown error, ms. @default 20000 (env ACS_SHUTDOWN_GRACE_MS)
   */
  readonly shutdownGraceMs: number;
  /**
   * Inference requests one lens fan-out runs at once (capture or steering with several prompts
   * and/or n > 1 becomes one request per choice; the rest wait for a free slot). @default 8
   * (env ACS_FANOUT_CONCURRENCY)
   */
  readonly lensFanOutConcurrency: number;
  /**
   * Most requests one key may have in flight at once, streamed or not; past it → 429
   * `rate_limited`. 0 = no cap. Keys off: no caps apply. @default 1024 (env ACS_MAX_REQUESTS_PER_KEY)
   */
  readonly maxRequestsPerKey: number;
  /** Most streams one key may have open at once; past it → 429. 0 = no cap. @default 512 (env ACS_MAX_STREAMS_PER_KEY) */
  readonly maxStreamsPerKey: number;
  /**
   * Share of a model's upstream capacity (Σ of its replicas' `max_concurrent_requests`) one key may
   * hold, in (0, 1]; past it → 429. @default 0.5 (env ACS_MAX_UPSTREAM_SHARE_PER_KEY)
   */
  readonly maxUpstreamSharePerKey: number;
  /**
   * A stream whose caller has not taken its bytes (the connection's write buffer stayed full) for
   * this long is ended: Inference aborted, the Hold settled to what was generated, ms.
   * @default 60000 (env ACS_STREAM_STALL_MS)
   */
  readonly streamStallMs: number;
  /**
   * Longest an upstream answer may go without an SSE event, ms: before its first (every
   * completion but prompt_logprobs and captures is streamed from Inference) and between two until
   * `[DONE]`. Past it the replica counts as failed (passive health) and the call fails over, or
   * ends 504 `deadline_exceeded`. 0 = no bound. @default 60000 (env ACS_UPSTREAM_HEADERS_TIMEOUT_MS)
   */
  readonly upstreamHeadersTimeoutMs: number;
  /**
   * Gateway processes serving the one port (node:cluster; src/server/cluster.ts); 1 = a single
   * process. @default os.availableParallelism() (env ACS_WORKERS)
   */
  readonly workers: number;
  /**
   * With ACS_WORKERS > 1: a listening worker the primary has not heard from for this long (one
   * still starting: twice this long since its last report, four times since its fork before its
   * first) is killed (SIGKILL) and started again, its event loop stalled (a report comes at least
   * once a second), as gunicorn's worker `timeout` does; 0: never, ms. @default 30000 (env ACS_WORKER_TIMEOUT_MS)
   */
  readonly workerTimeoutMs: number;
}

/** Why a file could not be read, in words (Node's errno codes). */
function readError(err: unknown): string {
  const code = (err as { code?: unknown }).code;
  if (code === "ENOENT") return "no such file";
  if (code === "EACCES" || code === "EPERM") return "permission denied";
  if (code === "EISDIR") return "it is a directory";
  return err instanceof Error ? err.message : String(err);
}

/**
 * Reads the configuration from the environment (checked against a schema, src/config/env-schema.ts)
 * and the models file it names (src/config/models-file.ts). Called once, by src/main.ts.
 * Throws ConfigError with a one-line message fit for the operator (it names the variable, the
 * file and the key at fault).
 */
export function loadConfig(rawEnv: Record<string, string | undefined> = process.env): Config {
  const env = parseEnv(rawEnv);
  let models: ModelConfig[] = [];
  if (env.ACS_MODELS !== undefined) {
    const path = env.ACS_MODELS;
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (err) {
      throw new ConfigError(`ACS_MODELS=${path}: cannot read the models file: ${readError(err)}`);
    }
    models = parseModelsFile(text, path);
  }
  const preset = env.ACS_ENGINE_PRESET;
  const embeddedEngine: EmbeddedEngineConfig | undefined =
    models.length === 0 ? { preset, aliases: preset === "llama-8b" ? ["llama-8b"] : ["tiny"] } : undefined;

  // Keys and Budgets: ACS_DB names a SQLite file (its directory must exist) or a PostgreSQL URL.
  const db = parseBudgetDb(env.ACS_DB);
  if (db?.kind === "sqlite") checkDbPath(db.path);

  const host = env.HOST;
  if (db === undefined && !isLoopback(host)) {
    throw new ConfigError(
      `HOST=${host} without keys: set ACS_DB to a keys database (npm run keys) before binding beyond loopback`,
    );
  }
  if (env.ACS_OPS_PORT !== undefined && env.ACS_OPS_PORT !== 0 && env.ACS_OPS_PORT === env.PORT) {
    throw new ConfigError(`ACS_OPS_PORT=${env.ACS_OPS_PORT}: the ops port must differ from PORT`);
  }
  const config: Config = {
    host,
    port: env.PORT,
    opsPort: env.ACS_OPS_PORT,
    models,
    modelsPath: env.ACS_MODELS,
    embeddedEngine,
    db,
    instanceId: env.ACS_INSTANCE_ID,
    leaseTtlMs: env.ACS_LEASE_TTL_MS,
    holdRenewMs: env.ACS_HOLD_RENEW_MS,
    keepaliveIntervalMs: env.ACS_KEEPALIVE_MS,
    nonStreamDeadlineMs: env.ACS_DEADLINE_MS,
    logLevel: env.ACS_LOG_LEVEL,
    logFormat: env.ACS_LOG_FORMAT,
    otlpEndpoint:
      env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ??
      (env.OTEL_EXPORTER_OTLP_ENDPOINT === undefined
        ? undefined
        : `${env.OTEL_EXPORTER_OTLP_ENDPOINT.replace(/\/+$/, "")}/v1/traces`),
    steeringRequestBytes: env.ACS_STEERING_REQUEST_BYTES,
    steeringProcessBytes: env.ACS_STEERING_PROCESS_BYTES,
    playgroundDir: env.ACS_PLAYGROUND_DIR,
    drainDelayMs: env.ACS_DRAIN_DELAY_MS,
    shutdownGraceMs: env.ACS_SHUTDOWN_GRACE_MS,
    lensFanOutConcurrency: env.ACS_FANOUT_CONCURRENCY,
    maxRequestsPerKey: env.ACS_MAX_REQUESTS_PER_KEY,
    maxStreamsPerKey: env.ACS_MAX_STREAMS_PER_KEY,
    maxUpstreamSharePerKey: env.ACS_MAX_UPSTREAM_SHARE_PER_KEY,
    streamStallMs: env.ACS_STREAM_STALL_MS,
    upstreamHeadersTimeoutMs: env.ACS_UPSTREAM_HEADERS_TIMEOUT_MS,
    workers: env.ACS_WORKERS,
    workerTimeoutMs: env.ACS_WORKER_TIMEOUT_MS,
  };
  return Object.freeze(config);
}

/**
 * ACS_DB: a `postgres://` or `postgresql://` URL selects PostgreSQL; any other value is the path of
 * a SQLite file; unset or empty, undefined. Throws ConfigError for a URL that does not parse.
 */
export function parseBudgetDb(value: string | undefined): BudgetDb | undefined {
  if (value === undefined || value === "") return undefined;
  if (!/^postgres(ql)?:\/\//i.test(value)) return { kind: "sqlite", path: value };
  try {
    new URL(value);
  } catch {
    throw new ConfigError("ACS_DB is not a valid postgres:// URL");
  }
  return { kind: "postgres", url: value };
}

/** True for loopback bind addresses (127.0.0.0/8, ::1, localhost). */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

export { ConfigError };
