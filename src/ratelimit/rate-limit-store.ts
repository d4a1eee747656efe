// The rate limiter's interface (issue 35): requests per minute and tokens per minute per scope,
// enforced with a **sliding window log** over 60 s. Each admitted request is one entry
// (reservation id, time, tokens) in the window of each of its scopes; an entry at time t counts
// at every instant now with now − 60 000 < t ≤ now, and leaves at exactly t + 60 000. A request is
// admitted when, on every scope, the entries in the window plus this one are within the limits,
// so in no 60-second window, however placed, does a scope admit more requests or reserve more
// tokens than its limit (a correction up, below, can only add what a request really used).
//
// Two backends, one behaviour (test/ratelimit/store-contract.test.ts): memory-store.ts (one
// process) and redis-store.ts (shared by every gateway process); failover-store.ts answers from
// the first while the second is down. headers.ts writes OpenAI's x-ratelimit-* headers.

/** The length of every window, in ms. */
export const WINDOW_MS = 60_000;

/** A scope's limits: integers in [1, MAX_AMOUNT]; an absent one is no limit. */
export interface RateLimits {
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
}

/**
 * A scope of limits: `id` names its window (the service uses `<key id>` and `<key id>|<model>`).
 * The limits are read at each decision, against the entries already in the window: a lowered
 * limit holds from the next reserve on. A scope with no limits still records its entries.
 */
export interface LimitScope {
  readonly id: string;
  readonly limits: RateLimits;
}

/** One limited dimension (requests or tokens), the tightest scope's view after the decision. */
export interface WindowState {
  readonly limit: number;
  /** limit − what the window holds (this request included when admitted), never below 0. */
  readonly remaining: number;
  /** ms until the window holds nothing that was in it now (OpenAI's "resets to its initial state"); 0 when empty. */
  readonly resetMs: number;
}

export interface RateDecision {
  readonly admitted: boolean;
  /**
   * Refused: ms until this request would fit (Retry-After, rounded up to whole seconds by the
   * caller), the largest wait over its scopes and dimensions; `Infinity` when its tokens exceed a
   * tokens-per-minute limit itself (it never fits: answer without Retry-After). Admitted: 0.
   */
  readonly retryAfterMs: number;
  /** Undefined when no scope limits requests. */
  readonly requests: WindowState | undefined;
  /** Undefined when no scope limits tokens. */
  readonly tokens: WindowState | undefined;
  /** Which limit refused (the scope and dimension of the largest wait), for the message. */
  readonly refusedBy?: { scope: string; dimension: "requests" | "tokens"; limit: number };
}

/**
 * The windows of every scope. Times are the caller's (`nowMs`, ms since the epoch, floored to an
 * integer), so tests control the clock; `tokens` are integers in [0, MAX_AMOUNT]. Invalid arguments throw a
 * RangeError (before anything is changed); a backend that cannot answer rejects with its error.
 */
export interface RateLimitStore {
  /**
   * Atomically admits one request of `tokens` tokens on every scope (an entry in each window), or
   * nothing at all. `reservationId` is unique per request (the request id): one already in a
   * window of these scopes is a RangeError.
   */
  reserve(
    scopes: readonly LimitScope[],
    reservationId: string,
    tokens: number,
    nowMs: number,
  ): Promise<RateDecision>;
  /** Sets a reservation's tokens to `tokens` (its usage, ≤ or ≥ what it reserved); the request entry stays. Idempotent; unknown/expired id: nothing. */
  correct(scopes: readonly LimitScope[], reservationId: string, tokens: number, nowMs: number): Promise<void>;
  /** Removes a reservation entirely (a request refused by a later check, never run). Idempotent. */
  release(scopes: readonly LimitScope[], reservationId: string, nowMs: number): Promise<void>;
  close(): Promise<void>;
}

/** The largest limit or token count taken: Redis's Lua writes numbers exactly up to 14 digits. */
export const MAX_AMOUNT = 1e12;

const isAmount = (n: number, min: number) => Number.isSafeInteger(n) && n >= min && n <= MAX_AMOUNT;

function checkLimit(scope: LimitScope, value: number | undefined, name: string): void {
  if (value !== undefined && !isAmount(value, 1)) {
    throw new RangeError(
      `scope ${JSON.stringify(scope.id)}: ${name} must be an integer in [1, 1e12], got ${value}`,
    );
  }
}

/** Throws a RangeError for limits, tokens or a time the stores do not take; returns the time floored. */
export function checkArguments(scopes: readonly LimitScope[], tokens: number, nowMs: number): number {
  for (const scope of scopes) {
    checkLimit(scope, scope.limits.requestsPerMinute, "requestsPerMinute");
    checkLimit(scope, scope.limits.tokensPerMinute, "tokensPerMinute");
  }
  if (new Set(scopes.map((s) => s.id)).size !== scopes.length) throw new RangeError("a scope is named twice");
  if (!isAmount(tokens, 0)) throw new RangeError(`tokens must be an integer in [0, 1e12], got ${tokens}`);
  if (!Number.isFinite(nowMs) || nowMs < 0)
    throw new RangeError(`nowMs must be a finite time ≥ 0, got ${nowMs}`);
  return Math.floor(nowMs);
}
