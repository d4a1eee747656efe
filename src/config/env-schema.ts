import { availableParallelism } from "node:os";
import { z } from "zod";
import { ConfigError } from "./config-error.js";
import { formatIssues } from "./format-issues.js";
import { limits } from "./limits.js";

/** pino's levels: the values ACS_LOG_LEVEL takes. */
export const logLevels = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
/** One of {@link logLevels}. */
export type LogLevel = (typeof logLevels)[number];

/** A decimal integer in [min, max] given as text. */
const intText = (min: number, max: number, fallback: number) =>
  z
    .string()
    .regex(/^\d+$/, { error: (iss) => `must be an integer, got ${JSON.stringify(iss.input)}` })
    .transform(Number)
    .refine((n) => n >= min && n <= max, { error: (iss) => `must be in [${min}, ${max}], got ${iss.input}` })
    .default(fallback);

/**
 * The environment variables the gateway reads, with their defaults (README "Configuration").
 * Other variables are ignored (the environment is shared with everything else on the machine); an
 * empty value counts as unset.
 */
const envSchema = z.object({
  HOST: z.string().default("127.0.0.1"),
  PORT: intText(0, 65535, 8080),
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
  ACS_STEERING_REQUEST_BYTES: intText(1, 2 ** 40, limits.steeringRequestBytes),
  ACS_STEERING_PROCESS_BYTES: intText(1, 2 ** 40, limits.steeringProcessBytes),
  ACS_WORKERS: intText(1, 1024, availableParallelism()),
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
