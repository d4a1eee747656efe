// §9 rate limits of a key: the `rate_limits` step of the check order (a request reserves one request
// and its tokens in the key's windows, and in the key × model's) and the end of that reservation
// when the call ends (corrected to what it used, or given back when it used nothing). The windows
// are src/ratelimit's: in memory, or shared by every gateway process through Redis.
import { randomUUID } from "node:crypto";
import { ApiError } from "../../core/errors/index.js";
import {
  type LimitScope,
  type RateDecision,
  type RateLimitStore,
  rateLimitHeaders,
} from "../../ratelimit/index.js";
import type { KeyInfo, KeyRateLimits } from "../ports.js";
import type { CallContext } from "../types.js";

export type { RateLimitStore };

/** A request's entries in its windows, until it ends. */
export interface RateReservation {
  readonly id: string;
  readonly scopes: readonly LimitScope[];
  readonly store: RateLimitStore;
}

/**
 * The scopes of a key's limits for one model: the key's own (`<key id>`) when it limits requests
 * or tokens, and the key × model's (`<key id>|<model id>`) when its limits name the model.
 */
export function scopesOf(keyId: string, limits: KeyRateLimits, modelId: string): LimitScope[] {
  const scopes: LimitScope[] = [];
  const own = { requestsPerMinute: limits.requestsPerMinute, tokensPerMinute: limits.tokensPerMinute };
  if (own.requestsPerMinute !== undefined || own.tokensPerMinute !== undefined)
    scopes.push({ id: keyId, limits: defined(own) });
  const perModel = limits.models?.[modelId];
  if (perModel !== undefined) scopes.push({ id: `${keyId}|${modelId}`, limits: defined(perModel) });
  return scopes;
}

function defined(l: { requestsPerMinute?: number | undefined; tokensPerMinute?: number | undefined }) {
  return {
    ...(l.requestsPerMinute === undefined ? {} : { requestsPerMinute: l.requestsPerMinute }),
    ...(l.tokensPerMinute === undefined ? {} : { tokensPerMinute: l.tokensPerMinute }),
  };
}

/** The refusal of a decision: 429 `rate_limited`, OpenAI's words, Retry-After when it can ever fit. */
function refusal(decision: RateDecision, tokens: number): ApiError {
  const by = decision.refusedBy;
  const what = by?.dimension === "tokens" ? "tokens per minute" : "requests per minute";
  const on = by === undefined ? "" : by.scope.includes("|") ? ` for model ${by.scope.split("|")[1]}` : "";
  const limit =
    by === undefined ? "" : ` Limit ${by.limit}, Requested ${by.dimension === "tokens" ? tokens : 1}.`;
  if (!Number.isFinite(decision.retryAfterMs)) {
    return new ApiError(
      "rate_limited",
      `Request too large for ${what}${on}:${limit} Lower max_tokens or the prompt: this request can never fit the limit.`,
      { retry: { retry: false } },
    );
  }
  const seconds = Math.max(1, Math.ceil(decision.retryAfterMs / 1000));
  return new ApiError(
    "rate_limited",
    `Rate limit reached for ${what}${on}:${limit} Please try again in ${seconds}s.`,
    { retry: { retry: true, afterSeconds: seconds } },
  );
}

/**
 * §9, the `rate_limits` step: reserves one request and `tokens` (the prompt + every choice's
 * max_tokens, before the Hold's clamp) on the key's scopes for the model, and sets OpenAI's
 * `x-ratelimit-*` headers on the answer, admitted or not. Throws ApiError 429 `rate_limited`
 * (Retry-After: when this request would fit). Undefined when the key has no limit for the model.
 */
export async function reserveRate(
  store: RateLimitStore,
  key: KeyInfo,
  modelId: string,
  tokens: number,
  ctx: CallContext,
): Promise<RateReservation | undefined> {
  const scopes = key.rateLimits === undefined ? [] : scopesOf(key.id, key.rateLimits, modelId);
  if (scopes.length === 0) return undefined;
  const id = randomUUID();
  const decision = await store.reserve(scopes, id, tokens, Date.now());
  for (const [name, value] of Object.entries(rateLimitHeaders(decision))) ctx.setResponseHeader(name, value);
  if (!decision.admitted) throw refusal(decision, tokens);
  return { id, scopes, store };
}

/**
 * Ends a reservation: its tokens corrected to `used` (prompt + generated, as charged), or the
 * whole entry given back when the call used nothing (refused after this step, or Inference did
 * no work). Never throws: a store that cannot answer is reported to `onError`.
 */
export async function endRate(
  rate: RateReservation | undefined,
  used: number,
  onError: (err: unknown) => void,
): Promise<void> {
  if (rate === undefined) return;
  try {
    if (used > 0) await rate.store.correct(rate.scopes, rate.id, used, Date.now());
    else await rate.store.release(rate.scopes, rate.id, Date.now());
  } catch (err) {
    onError(err);
  }
}
