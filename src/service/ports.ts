// What the service needs of the Budget ledger, as an interface (src/budget implements it; the
// Inference port is src/upstream/port.ts; the app wiring in src/app/build-app.ts plugs the real
// ones in).
// A ledger may answer synchronously (SQLite) or asynchronously (a database over the network):
// the service awaits every call.
import type { HoldDemand, UsageEntry } from "../budget/index.js";

/** A key that authenticate() accepted. */
export interface KeyInfo {
  readonly id: string;
  /** The key's name, for logs (never the key itself). */
  readonly name?: string;
  /** The key's rate limits (proto/API.md §9), for the key and per model; absent: none. */
  readonly rateLimits?: KeyRateLimits;
}

/** Requests and tokens per minute (integers ≥ 1; absent: no limit). */
export interface RateLimitPair {
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
}

/** A key's rate limits: its own, and per model id. */
export interface KeyRateLimits extends RateLimitPair {
  readonly models?: Readonly<Record<string, RateLimitPair>>;
}

/** A value, or a promise of it. */
export type MaybePromise<T> = T | Promise<T>;

/** The Budget ledger (src/budget): keys, Holds, settle. */
export interface Ledger {
  /** Throws ApiError 401 `invalid_api_key`. */
  authenticate(authorization: string | undefined): MaybePromise<KeyInfo>;
  /** Throws ApiError 403 `model_not_allowed` unless the key may use the model (by id or one of its aliases). */
  checkModel(key: KeyInfo, modelId: string, aliases?: readonly string[]): MaybePromise<void>;
  /**
   * Reserves the demand's tokens in one transaction, lowering maxTokens to what the Budget holds
   * (clamped: true); throws ApiError 429 `insufficient_quota` when not one token fits. A demand
   * whose promptTokens is a bound (`promptTokensBound`) is held only whole, else nothing is placed
   * and the answer is `{countNeeded: true}`: count the prompt exactly and ask again.
   */
  placeHold(
    key: KeyInfo,
    demand: HoldDemand,
  ): MaybePromise<
    { holdId: string; maxTokens: number; clamped: boolean; heldTokens: number } | { countNeeded: true }
  >;
  /**
   * Keeps a long stream's Hold from being reclaimed as stale, recording usedTokens (prompt +
   * generated so far): a Hold reclaimed after its gateway died is charged at least that.
   */
  renew(holdId: string, usedTokens: number): MaybePromise<unknown>;
  /**
   * Charges the tokens used and releases the rest; exactly once (later calls are no-ops). Its
   * answer (`LedgerSettleResult`: the tokens charged) goes to the {@link UsageLog}.
   */
  settle(holdId: string, usedTokens: number): MaybePromise<unknown>;
  /**
   * Whether the Hold still covers what its request may deliver: `true` at once in the usual case
   * (asked before each chunk and before a non-streamed answer); false when the Budget no longer
   * holds it (a replica stalled or cut off from the store past its Hold's or lease's expiry, which
   * was reclaimed meanwhile, and the key's free tokens cannot take the Hold over): the request then
   * delivers nothing more. Rejects when the store cannot be reached.
   */
  standing(holdId: string): true | Promise<boolean>;
}

/**
 * Where the service hands the record of each settled request (src/budget implements it: queued in
 * memory, written in batches). Called once per request that had a Hold, after its settle; never
 * blocks and never throws (src/budget/README.md, "Usage records").
 */
export interface UsageLog {
  record(entry: UsageEntry): void;
}
