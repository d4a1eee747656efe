import { availableParallelism } from "node:os";
import { z } from "zod";
import { ConfigError } from "./config-error.js";
import { formatIssues } from "./format-issues.js";
import { limits, machineryDefaults } from "./limits.js";

/** pino's levels: the values ACS_LOG_LEVEL takes. */
export const logLevels = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
/** One of {@link logLevels}. */
export type LogLevel = (typeof logLevels)[number];

/** A decimal integer in [min, max] given as text; unset: undefined. */
const optionalIntText = (min: number, max: number) =>
  z
    .string()
    .regex(/^\d+$/, { error: (iss) => `must be an integer, got ${JSON.stringify(iss.input)}` })
    .transform(Number)
    .refine((n) => n >= min && n <= max, { error: (iss) => `must be in [${min}, ${max}], got ${iss.input}` })
    .optional();

/** A decimal integer in [min, max] given as text; unset: `fallback`. */
const intText = (min: number, max: number, fallback: number) =>
  optionalIntText(min, max).transform((n) => n ?? fallback);

/** A decimal fraction in (0, 1] given as text (`0.5`, `1`). */
const fractionText = (fallback: number) =>
  z
    .string()
    .regex(/^(0|1)?(\.\d+)?$/, {
      error: (iss) => `must be a number in (0, 1], got ${JSON.stringify(iss.input)}`,
    })
    .transform(Number)
    .refine((n) => n > 0 && n <= 1, { error: (iss) => `must be in (0, 1], got ${iss.input}` })
    .default(fallback);

/**
 * The environment variables the gateway reads, with their defaults (src/OPERATIONS.md,
 * "Configuration (environment)": test/config/operations-doc.test.ts holds that table to these keys).
 * Other variables are ignored (the environment is shared with everything else on the machine); an
 * empty value counts as unset.
 */
export const envSchema = z.object({
  /** Bind address. @default "127.0.0.1" */
  HOST: z.string().default("127.0.0.1"),
  /** TCP port for REST, Connect, gRPC-Web and gRPC; 0 = any free port. @default 8080 */
  PORT: intText(0, 65535, 8080),
  /**
   * A second TCP port (on HOST) serving only GET /healthz, /readyz and /metrics, answered by the
   * cluster's primary with ACS_WORKERS > 1: probes that never queue behind the callers'
   * connections. 0 = any free port; unset = none (the ops routes stay on PORT either way).
   */
  ACS_OPS_PORT: optionalIntText(0, 65535),
  /** Path of the JSON models file (src/config/models-file.ts); unset = the embedded engine. */
  ACS_MODELS: z.string().optional(),
  /** Preset of the embedded reference engine (src/engine), with no ACS_MODELS. @default "llama-8b" */
  ACS_ENGINE_PRESET: z
    .enum(["tiny", "llama-8b"], {
      error: (iss) => `must be tiny or llama-8b, got ${JSON.stringify(iss.input)}`,
    })
    .default("llama-8b"),
  /**
   * Where keys and Budgets live: a SQLite file, or a `postgres://` (`postgresql://`) URL shared by
   * gateway replicas; unset = authentication off (loopback only). Read by parseBudgetDb.
   */
  ACS_DB: z.string().optional(),
  /**
   * This replica's stable name in the shared database, so that a restart releases the Holds and
   * leases its previous run left at once (else they expire).
   */
  ACS_INSTANCE_ID: z.string().optional(),
  /**
   * Redis the keys' rate limits are counted in, shared by every gateway process and replica
   * (`redis://host:6379`); unset = each process counts its own (src/ratelimit).
   */
  ACS_REDIS_URL: z.string().url().optional(),
  /** How long a replica's lease outlives its last sync (a dead replica's is reclaimed after it), ms. @default 30000 */
  ACS_LEASE_TTL_MS: intText(1000, 3_600_000, machineryDefaults.leaseTtlMs),
  /** How often a stream renews its Hold, recording the tokens generated so far, ms. @default 10000 */
  ACS_HOLD_RENEW_MS: intText(10, 600_000, 10_000),
  /** SSE `: keepalive` interval, ms. @default 5000 (limits.keepaliveIntervalMs) */
  ACS_KEEPALIVE_MS: intText(10, 3_600_000, limits.keepaliveIntervalMs),
  /** Longest wait for a non-streamed answer, ms. @default 840000 (14 min: limits.nonStreamDeadlineMs) */
  ACS_DEADLINE_MS: intText(10, 24 * 3_600_000, limits.nonStreamDeadlineMs),
  /** pino level. @default "info" */
  ACS_LOG_LEVEL: z
    .enum(logLevels, {
      error: (iss) => `must be one of ${logLevels.join(", ")}, got ${JSON.stringify(iss.input)}`,
    })
    .default("info"),
  /** Log lines as JSON (one object a line) or `pretty` (pino-pretty, for people). @default "json" */
  ACS_LOG_FORMAT: z
    .enum(["json", "pretty"], {
      error: (iss) => `must be json or pretty, got ${JSON.stringify(iss.input)}`,
    })
    .default("json"),
  /** OTLP/HTTP base URL: spans go to it + `/v1/traces` (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT wins). */
  OTEL_EXPORTER_OTLP_ENDPOINT: z
    .url({ protocol: /^https?$/, error: (iss) => `must be an http(s) URL, got ${JSON.stringify(iss.input)}` })
    .optional(),
  /** OTLP/HTTP URL spans are exported to, as it is; neither set = none exported (`traceparent` is still passed on). */
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: z
    .url({ protocol: /^https?$/, error: (iss) => `must be an http(s) URL, got ${JSON.stringify(iss.input)}` })
    .optional(),
  /**
   * Most bytes of decoded steering tensors one request may hold (elements × 2 or 4 bytes, whatever
   * the compression); more → 413 `request_too_large`. @default 33554432 (32 MiB: 2^23 float32;
   * limits.steeringRequestBytes)
   */
  ACS_STEERING_REQUEST_BYTES: intText(1, 2 ** 40, limits.steeringRequestBytes),
  /**
   * Most bytes of decoded steering tensors all requests in flight may hold together; past it →
   * 429 `rate_limited` with `Retry-After: 1`. @default 268435456 (256 MiB; limits.steeringProcessBytes)
   */
  ACS_STEERING_PROCESS_BYTES: intText(1, 2 ** 40, limits.steeringProcessBytes),
  /**
   * The built playground page served at GET /playground (`npm run build:playground` writes it).
   * @default dist/playground of the package (unset: src/surfaces/http/build-server.ts)
   */
  ACS_PLAYGROUND_DIR: z.string().optional(),
  /**
   * After SIGTERM/SIGINT, how long the gateway reports not ready (`/readyz` 503, gRPC health
   * NOT_SERVING) while still accepting and serving, so that load balancers stop sending first, ms.
   * @default 5000
   */
  ACS_DRAIN_DELAY_MS: intText(0, 3_600_000, 5000),
  /**
   * Once it stops accepting, how long calls in flight (unary and streams, every protocol) may go on
   * before they end with the shutdown error, ms. @default 20000
   */
  ACS_SHUTDOWN_GRACE_MS: intText(0, 24 * 3_600_000, 20_000),
  /**
   * Inference requests one lens fan-out runs at once (capture or steering with several prompts
   * and/or n > 1 becomes one request per choice; the rest wait for a free slot).
   * @default 8 (limits.lensFanOutConcurrency)
   */
  ACS_FANOUT_CONCURRENCY: intText(1, 4096, limits.lensFanOutConcurrency),
  /**
   * Most requests one key may have in flight at once, streamed or not; past it → 429
   * `rate_limited`. 0 = no cap. Keys off: no caps apply. @default 1024 (limits.maxRequestsPerKey)
   */
  ACS_MAX_REQUESTS_PER_KEY: intText(0, 1_000_000, limits.maxRequestsPerKey),
  /** Most streams one key may have open at once; past it → 429. 0 = no cap. @default 512 (limits.maxStreamsPerKey) */
  ACS_MAX_STREAMS_PER_KEY: intText(0, 1_000_000, limits.maxStreamsPerKey),
  /**
   * Share of a model's upstream capacity (Σ of its replicas' `max_concurrent_requests`) one key may
   * hold, in (0, 1]; past it → 429. @default 0.5 (limits.maxUpstreamSharePerKey)
   */
  ACS_MAX_UPSTREAM_SHARE_PER_KEY: fractionText(limits.maxUpstreamSharePerKey),
  /**
   * A stream whose caller has not taken its bytes (the connection's write buffer stayed full) for
   * this long is ended: Inference aborted, the Hold settled to what was generated, ms.
   * @default 60000 (limits.streamStallMs)
   */
  ACS_STREAM_STALL_MS: intText(10, 24 * 3_600_000, limits.streamStallMs),
  /**
   * Longest an upstream answer may go without an SSE event, ms: before its first (every
   * completion but prompt_logprobs and captures is streamed from Inference) and between two until
   * `[DONE]`. Past it the replica counts as failed (passive health) and the call fails over, or
   * ends 504 `deadline_exceeded`. 0 = no bound. @default 60000 (limits.upstreamHeadersTimeoutMs)
   */
  ACS_UPSTREAM_HEADERS_TIMEOUT_MS: intText(0, 24 * 3_600_000, limits.upstreamHeadersTimeoutMs),
  /**
   * Gateway processes serving the one port (node:cluster; src/app/cluster.ts); 1 = a single
   * process. @default os.availableParallelism()
   */
  ACS_WORKERS: intText(1, 1024, availableParallelism()),
  /**
   * A listening worker the primary has not heard from for this long (one still starting: twice
   * this long since its last report, four times since its fork before its first) is killed
   * (SIGKILL) and started again, its event loop stalled (a report comes at least once a second),
   * as gunicorn's worker `timeout` does, ms; with ACS_WORKERS > 1. 0: never; else 10 s at least:
   * far above a loaded worker's lag, so that load kills no worker. @default 30000
   */
  ACS_WORKER_TIMEOUT_MS: z
    .string()
    .regex(/^\d+$/, { error: (iss) => `must be an integer, got ${JSON.stringify(iss.input)}` })
    .transform(Number)
    .refine((n) => n === 0 || (n >= 10_000 && n <= 3_600_000), {
      error: (iss) => `must be 0 (never) or in [10000, 3600000], got ${iss.input}`,
    })
    .default(30_000),
});

/** The checked environment: every variable at its value or its default (each documented above). */
export type Env = z.output<typeof envSchema>;

/** Checks the environment against its schema; throws ConfigError naming each bad variable. */
export function parseEnv(raw: Record<string, string | undefined>): Env {
  const set = Object.fromEntries(Object.entries(raw).filter(([, v]) => v !== undefined && v !== ""));
  const parsed = envSchema.safeParse(set, { reportInput: true });
  if (!parsed.success) throw new ConfigError(formatIssues(parsed.error.issues));
  return parsed.data;
}
