// The ledger's errors, each written once: the refusals meant for callers (ApiErrors of the
// catalogue in src/core/errors), the one for ids the store does not know, and the range checks.
import { ApiError, type RetryAdvice } from "../../core/errors/index.js";
import type { PlaceHoldOutcome } from "../budget-store.js";
import type { HoldDemand } from "../plan-hold.js";

/**
 * Seconds a caller refused only because of Holds in flight is told to wait (`Retry-After`): the
 * ledger cannot know when they settle; one second lets a client try again soon, at no cost.
 */
export const HOLD_RETRY_AFTER_SECONDS = 1;

/**
 * Whether a request refused with `insufficient_quota` can succeed later: yes when the Budget less
 * what is spent would hold it once the Holds in flight settle; no when the Budget is spent.
 */
export function quotaRetry(outcome: {
  readonly budgetTokens: number;
  readonly spentTokens: number;
  readonly minimumTokens: number;
}): RetryAdvice {
  return outcome.budgetTokens - outcome.spentTokens >= outcome.minimumTokens
    ? { retry: true, afterSeconds: HOLD_RETRY_AFTER_SECONDS }
    : { retry: false };
}

/** Thrown for an id (key or Hold) the store does not know; `kind` says which. */
export class UnknownIdError extends Error {
  override readonly name = "UnknownIdError";
  constructor(
    readonly kind: "key" | "hold" | "admin key",
    readonly id: string,
  ) {
    super(`No ${kind} with id '${id}'.`);
  }
}

const NO_KEY_MESSAGE =
  "You didn't provide an API key. You need to provide your API key in an Authorization header using " +
  "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).";
const WRONG_SCHEME_MESSAGE =
  "Unsupported authorization scheme. You need to provide your API key in an Authorization header using " +
  "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).";

/** 401 `invalid_api_key` for a request without an `Authorization` header. */
export function noKey(): ApiError {
  return new ApiError("invalid_api_key", NO_KEY_MESSAGE);
}

/** 401 `invalid_api_key` for an `Authorization` header of another scheme than Bearer. */
export function wrongScheme(): ApiError {
  return new ApiError("invalid_api_key", WRONG_SCHEME_MESSAGE);
}

/**
 * 401 `invalid_api_key` for a key the store does not know; `masked` is the key as messages may
 * show it (`maskApiKey`), or null to show nothing of it.
 */
export function incorrectKey(masked: string | null): ApiError {
  return new ApiError(
    "invalid_api_key",
    `Incorrect API key provided${masked === null ? "" : `: ${masked}`}. Check the key, or ask the API's operator for one.`,
  );
}

/**
 * 401 `invalid_api_key` for a revoked key, in the same words whether authenticate or placeHold
 * finds it revoked (a revoke on another replica reaches placeHold within the auth cache's TTL).
 */
export function revokedKey(hint: string | undefined): ApiError {
  return new ApiError(
    "invalid_api_key",
    `The API key provided${hint === undefined ? "" : ` (${hint})`} has been revoked. Ask the API's operator for a new key.`,
  );
}

/**
 * 401 `invalid_api_key` for a key past its expiry, in the same words whether authenticate or
 * placeHold finds it expired; the message names the expiry (ISO 8601, UTC).
 */
export function expiredKey(hint: string | undefined, expiresAt: number): ApiError {
  return new ApiError(
    "invalid_api_key",
    `The API key provided${hint === undefined ? "" : ` (${hint})`} expired at ${new Date(expiresAt).toISOString()}. ` +
      "Ask the API's operator for a new key.",
  );
}

/** 403 `permission_denied`: an admin key sent to a route that serves API keys (completions, models, tokenize). */
export function adminKeyOnApiRoute(): ApiError {
  return new ApiError(
    "permission_denied",
    "An admin key cannot be used for this route: admin keys serve only the admin API (/v1/admin/…). Use an API key.",
  );
}

/** 403 `permission_denied`: an API key sent to the admin API. */
export function apiKeyOnAdminRoute(): ApiError {
  return new ApiError(
    "permission_denied",
    "An API key cannot be used for the admin API: it needs an admin key (acs-admin-…). Ask the API's operator for one.",
  );
}

/** 401 `invalid_api_key` for an admin key the store does not know, or a revoked one. */
export function incorrectAdminKey(masked: string | null, revoked: boolean): ApiError {
  return new ApiError(
    "invalid_api_key",
    revoked
      ? `The admin key provided${masked === null ? "" : ` (${masked})`} has been revoked.`
      : `Incorrect admin key provided${masked === null ? "" : `: ${masked}`}. Check the key, or create one with \`npm run keys -- create-admin\`.`,
  );
}

/** 403 `model_not_allowed` (param `model`): the key's allow-list names neither the model nor an alias. */
export function modelNotAllowed(modelId: string): ApiError {
  return new ApiError(
    "model_not_allowed",
    `The API key provided is not allowed to use the model '${modelId}'.`,
    {
      param: "model",
    },
  );
}

/**
 * 429 `insufficient_quota` for a demand the key's Budget cannot hold even at one generated token
 * per choice: what it needs and what the Budget has, with the retry advice of {@link quotaRetry}.
 */
export function insufficientQuota(
  outcome: Extract<PlaceHoldOutcome, { kind: "insufficient" }>,
  demand: HoldDemand,
): ApiError {
  const available = outcome.budgetTokens - outcome.spentTokens - outcome.heldTokens;
  return new ApiError(
    "insufficient_quota",
    `You exceeded your current quota: this request needs at least ${outcome.minimumTokens} tokens ` +
      `(${demand.promptTokens} prompt tokens + ${demand.prompts * demand.n} × 1 generated token` +
      `${demand.captureReplay === true ? ` + ${demand.n * demand.promptTokens} tokens of the capture's replay` : ""}), ` +
      `and the key's Budget has ${Math.max(0, available)} of ${outcome.budgetTokens} tokens left ` +
      `(${outcome.spentTokens} spent, ${outcome.heldTokens} held by requests in flight).`,
    { retry: quotaRetry(outcome) },
  );
}

/**
 * 503 `upstream_unavailable` (retry after 1 s) for a request the ledger could not serve because
 * its store failed (`cause`, kept for the logs): `what` says what could not be done. An ApiError
 * (a refusal meant for the caller) passes unchanged.
 */
export function storeUnavailable(cause: unknown, what: string): ApiError {
  if (cause instanceof ApiError) return cause;
  return new ApiError(
    "upstream_unavailable",
    `The Budget ledger is unavailable (its store cannot be read or written right now), so ${what}; ` +
      "the request was not run. Retry the request.",
    { cause, retry: { retry: true, afterSeconds: HOLD_RETRY_AFTER_SECONDS } },
  );
}

/** RangeError unless `value` is a safe integer ≥ `min`; `name` names it in the message. */
export function checkInt(name: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`${name} must be an integer ≥ ${min}, got ${value}`);
  }
}
