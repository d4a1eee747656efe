// The settings of a key that admins set besides its Budget: rate limits (stored and returned;
// enforced by src/ratelimit), an expiry and metadata. Their shapes and their checks, written once
// for every front end (the keys CLI, the admin API on REST and Connect).

/** Requests and tokens per minute; a limit left out is no limit. */
export interface RateLimitPair {
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
}

/** A key's rate limits: for the key as a whole, and per model (by model id or alias). */
export interface RateLimits extends RateLimitPair {
  readonly models?: Readonly<Record<string, RateLimitPair>>;
}

/** A key's metadata: string → string, OpenAI-like caps (see {@link checkMetadata}). */
export type KeyMetadata = Readonly<Record<string, string>>;

/** Metadata pairs at most. */
export const METADATA_MAX_PAIRS = 16;
/** A metadata key's characters at most. */
export const METADATA_MAX_KEY_CHARS = 64;
/** A metadata value's characters at most. */
export const METADATA_MAX_VALUE_CHARS = 512;

/**
 * A key setting that does not pass its check: `param` names it as the admin API's JSON does
 * (`rate_limits.requests_per_minute`, `metadata`, `expires_at`, `budget_tokens`, `models`).
 */
export class KeySettingError extends RangeError {
  override readonly name = "KeySettingError";
  constructor(
    readonly param: string,
    message: string,
  ) {
    super(message);
  }
}

function checkLimit(param: string, value: number | undefined): void {
  if (value !== undefined && (!Number.isSafeInteger(value) || value < 1)) {
    throw new KeySettingError(param, `Invalid value for '${param}': expected an integer ≥ 1, got ${value}.`);
  }
}

/** Throws KeySettingError unless every limit is an integer ≥ 1 and every model id is non-empty. */
export function checkRateLimits(limits: RateLimits): void {
  checkLimit("rate_limits.requests_per_minute", limits.requestsPerMinute);
  checkLimit("rate_limits.tokens_per_minute", limits.tokensPerMinute);
  for (const [model, pair] of Object.entries(limits.models ?? {})) {
    if (model === "") throw new KeySettingError("rate_limits.models", "A model id must not be empty.");
    checkLimit(`rate_limits.models.${model}.requests_per_minute`, pair.requestsPerMinute);
    checkLimit(`rate_limits.models.${model}.tokens_per_minute`, pair.tokensPerMinute);
  }
}

/**
 * Throws KeySettingError (param `metadata`) unless there are at most 16 pairs, each key 1–64
 * characters and each value at most 512.
 */
export function checkMetadata(metadata: KeyMetadata): void {
  const entries = Object.entries(metadata);
  if (entries.length > METADATA_MAX_PAIRS) {
    throw new KeySettingError(
      "metadata",
      `At most ${METADATA_MAX_PAIRS} metadata pairs, got ${entries.length}.`,
    );
  }
  for (const [k, v] of entries) {
    if (k.length === 0 || k.length > METADATA_MAX_KEY_CHARS) {
      throw new KeySettingError(
        "metadata",
        `A metadata key has 1 to ${METADATA_MAX_KEY_CHARS} characters: '${k}'.`,
      );
    }
    if (typeof v !== "string" || v.length > METADATA_MAX_VALUE_CHARS) {
      throw new KeySettingError(
        "metadata",
        `The value of metadata '${k}' is a string of at most ${METADATA_MAX_VALUE_CHARS} characters.`,
      );
    }
  }
}

/** Throws KeySettingError unless `expiresAt` (Unix epoch ms) is a safe integer ≥ 0 or null. */
export function checkExpiresAt(expiresAt: number | null): void {
  if (expiresAt !== null && (!Number.isSafeInteger(expiresAt) || expiresAt < 0)) {
    throw new KeySettingError(
      "expires_at",
      `Invalid value for 'expires_at': expected Unix epoch milliseconds.`,
    );
  }
}

/** The JSON a store keeps for rate limits (the admin API's snake_case shape). */
export function rateLimitsToJson(limits: RateLimits): Record<string, unknown> {
  const pair = (p: RateLimitPair) => ({
    ...(p.requestsPerMinute === undefined ? {} : { requests_per_minute: p.requestsPerMinute }),
    ...(p.tokensPerMinute === undefined ? {} : { tokens_per_minute: p.tokensPerMinute }),
  });
  return {
    ...pair(limits),
    ...(limits.models === undefined
      ? {}
      : { models: Object.fromEntries(Object.entries(limits.models).map(([m, p]) => [m, pair(p)])) }),
  };
}

/** The rate limits of the JSON {@link rateLimitsToJson} wrote. */
export function rateLimitsFromJson(json: unknown): RateLimits {
  const o = (json ?? {}) as Record<string, unknown>;
  const pair = (p: Record<string, unknown>): RateLimitPair => ({
    ...(typeof p.requests_per_minute === "number" ? { requestsPerMinute: p.requests_per_minute } : {}),
    ...(typeof p.tokens_per_minute === "number" ? { tokensPerMinute: p.tokens_per_minute } : {}),
  });
  const models = o.models as Record<string, Record<string, unknown>> | undefined;
  return {
    ...pair(o),
    ...(models === undefined
      ? {}
      : { models: Object.fromEntries(Object.entries(models).map(([m, p]) => [m, pair(p)])) }),
  };
}
