import { readFileSync } from "node:fs";
import { checkDbPath } from "./check-db-path.js";
import { ConfigError } from "./config-error.js";
import { type Env, parseEnv } from "./env-schema.js";
import { limits, machineryDefaults } from "./limits.js";
import { type ModelConfig, parseModelsFile } from "./models-file.js";

export { limits, machineryDefaults };

/** The embedded reference engine that `npm start` runs when no models file is given. */
export interface EmbeddedEngineConfig {
  /** Engine preset (src/engine): ACS_ENGINE_PRESET. */
  readonly preset: Env["ACS_ENGINE_PRESET"];
  /** Aliases of the embedded model: the preset's name. */
  readonly aliases: readonly string[];
}

/**
 * Where keys and Budgets live (env ACS_DB): a SQLite file (the embedded default, one gateway
 * process) or a PostgreSQL database shared by gateway replicas (`postgres://` or `postgresql://`).
 */
export type BudgetDb =
  | { readonly kind: "sqlite"; readonly path: string }
  | { readonly kind: "postgres"; readonly url: string };

/**
 * The fields of {@link Config} that are one variable each, as the schema reads it: field →
 * variable (its meaning, unit and default: its docstring in src/config/env-schema.ts).
 */
const fromVariables = {
  host: "HOST",
  port: "PORT",
  opsPort: "ACS_OPS_PORT",
  modelsPath: "ACS_MODELS",
  instanceId: "ACS_INSTANCE_ID",
  redisUrl: "ACS_REDIS_URL",
  leaseTtlMs: "ACS_LEASE_TTL_MS",
  holdRenewMs: "ACS_HOLD_RENEW_MS",
  keepaliveIntervalMs: "ACS_KEEPALIVE_MS",
  nonStreamDeadlineMs: "ACS_DEADLINE_MS",
  logLevel: "ACS_LOG_LEVEL",
  logFormat: "ACS_LOG_FORMAT",
  steeringRequestBytes: "ACS_STEERING_REQUEST_BYTES",
  steeringProcessBytes: "ACS_STEERING_PROCESS_BYTES",
  playgroundDir: "ACS_PLAYGROUND_DIR",
  drainDelayMs: "ACS_DRAIN_DELAY_MS",
  shutdownGraceMs: "ACS_SHUTDOWN_GRACE_MS",
  lensFanOutConcurrency: "ACS_FANOUT_CONCURRENCY",
  maxRequestsPerKey: "ACS_MAX_REQUESTS_PER_KEY",
  maxStreamsPerKey: "ACS_MAX_STREAMS_PER_KEY",
  maxUpstreamSharePerKey: "ACS_MAX_UPSTREAM_SHARE_PER_KEY",
  streamStallMs: "ACS_STREAM_STALL_MS",
  upstreamHeadersTimeoutMs: "ACS_UPSTREAM_HEADERS_TIMEOUT_MS",
  workers: "ACS_WORKERS",
  workerTimeoutMs: "ACS_WORKER_TIMEOUT_MS",
} as const satisfies Record<string, keyof Env>;

/** {@link Config}'s fields of one variable each, typed as the schema's output. */
export type EnvSettings = { readonly [K in keyof typeof fromVariables]: Env[(typeof fromVariables)[K]] };

/**
 * The whole configuration, parsed once at start (nothing else reads process.env): every default
 * resolved. The settings of one variable each ({@link EnvSettings}), and what is assembled from
 * several sources below.
 */
export interface Config extends EnvSettings {
  /** Served models (env ACS_MODELS = path of a JSON models file); empty with an embedded engine. */
  readonly models: readonly ModelConfig[];
  /** Set when the gateway starts the reference engine itself (no ACS_MODELS). */
  readonly embeddedEngine: EmbeddedEngineConfig | undefined;
  /** Database of keys and Budgets; undefined = authentication off (loopback only). (env ACS_DB) */
  readonly db: BudgetDb | undefined;
  /**
   * The OTLP/HTTP URL OpenTelemetry spans are exported to; undefined = none exported (the
   * `traceparent` header is still passed on). (env OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is,
   * else OTEL_EXPORTER_OTLP_ENDPOINT + `/v1/traces`, as the OpenTelemetry specification says)
   */
  readonly otlpEndpoint: string | undefined;
}

/** The {@link EnvSettings} of a checked environment. */
function envSettings(env: Env): EnvSettings {
  const entries = Object.entries(fromVariables).map(([field, variable]) => [field, env[variable]]);
  return Object.fromEntries(entries) as unknown as EnvSettings;
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
    ...envSettings(env),
    models,
    embeddedEngine,
    db,
    otlpEndpoint:
      env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ??
      (env.OTEL_EXPORTER_OTLP_ENDPOINT === undefined
        ? undefined
        : `${env.OTEL_EXPORTER_OTLP_ENDPOINT.replace(/\/+$/, "")}/v1/traces`),
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
