import { availableParallelism } from "node:os";
import { z } from "zod";
import { ConfigError } from "./config-error.js";
import { formatIssues } from "./format-issues.js";
import { limits } from "./limits.js";

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
  HOST: z.string().default("127.0.0.1"),
  PORT: intText(0, 65535, 8080),
  ACS_OPS_PORT: optionalIntText(0, 65535),
  ACS_MODELS: z.string().optional(),
  ACS_ENGINE_PRESET: z
    .enum(["tiny", "llama-8b"], {
      error: (iss) => `must be tiny or llama-8b, got ${JSON.stringify(iss.input)}`,
    })
    .default("llama-8b"),
  ACS_DB: z.string().optional(),
  ACS_INSTANCE_ID: z.string().optional(),
  ACS_LEASE_TTL_MS: intText(1000, 3_600_000, 30_000),
  ACS_HOLD_RENEW_MS: intText(10, 600_000, 10_000),
  ACS_KEEPALIVE_MS: intText(10, 3_600_000, limits.keepaliveIntervalMs),
  ACS_DEADLINE_MS: intText(10, 24 * 3_600_000, limits.nonStreamDeadlineMs),
  ACS_LOG_LEVEL: z
    .enum(logLevels, {
      error: (iss) => `must be one of ${logLevels.join(", ")}, got ${JSON.stringify(iss.input)}`,
    })
    .default("info"),
  ACS_LOG_FORMAT: z
    .enum(["json", "pretty"], {
      error: (iss) => `must be json or pretty, got ${JSON.stringify(iss.input)}`,
    })
    .default("json"),
  OTEL_EXPORTER_OTLP_ENDPOINT: z
    .url({ protocol: /^https?$/, error: (iss) => `must be an http(s) URL, got ${JSON.stringify(iss.input)}` })
    .optional(),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: z
    .url({ protocol: /^https?$/, error: (iss) => `must be an http(s) URL, got ${JSON.stringify(iss.input)}` })
    .optional(),
  ACS_STEERING_REQUEST_BYTES: intText(1, 2 ** 40, limits.steeringRequestBytes),
  ACS_STEERING_PROCESS_BYTES: intText(1, 2 ** 40, limits.steeringProcessBytes),
  ACS_PLAYGROUND_DIR: z.string().optional(),
  ACS_DRAIN_DELAY_MS: intText(0, 3_600_000, 5000),
  ACS_SHUTDOWN_GRACE_MS: intText(0, 24 * 3_600_000, 20_000),
  ACS_FANOUT_CONCURRENCY: intText(1, 4096, limits.lensFanOutConcurrency),
  ACS_MAX_REQUESTS_PER_KEY: intText(0, 1_000_000, limits.maxRequestsPerKey),
  ACS_MAX_STREAMS_PER_KEY: intText(0, 1_000_000, limits.maxStreamsPerKey),
  ACS_MAX_UPSTREAM_SHARE_PER_KEY: fractionText(limits.maxUpstreamSharePerKey),
  ACS_STREAM_STALL_MS: intText(10, 24 * 3_600_000, limits.streamStallMs),
  // 0: no bound.
  ACS_UPSTREAM_HEADERS_TIMEOUT_MS: intText(0, 24 * 3_600_000, limits.upstreamHeadersTimeoutMs),
  ACS_WORKERS: intText(1, 1024, availableParallelism()),
  // 0: never. Else 10 s at least: far above a loaded worker's lag, so that load kills no worker.
  ACS_WORKER_TIMEOUT_MS: z
    .string()
    .regex(/^\d+$/, { error: (iss) => `must be an integer, got ${JSON.stringify(iss.input)}` })
    .transform(Number)
    .refine((n) => n === 0 || (n >= 10_000 && n <= 3_600_000), {
      error: (iss) => `must be 0 (never) or in [10000, 3600000], got ${iss.input}`,
    })
    .default(30_000),
});

/** The checked environment. */
export type Env = z.infer<typeof envSchema>;

/** Checks the environment against its schema; throws ConfigError naming each bad variable. */
export function parseEnv(raw: Record<string, string | undefined>): Env {
  const set = Object.fromEntries(Object.entries(raw).filter(([, v]) => v !== undefined && v !== ""));
  const parsed = envSchema.safeParse(set, { reportInput: true });
  if (!parsed.success) throw new ConfigError(formatIssues(parsed.error.issues));
  return parsed.data;
}
