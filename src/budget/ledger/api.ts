// What the service sees of the ledger: the BudgetLedger interface and the shapes it takes and
// returns (keys, Holds, usage). Opened by `createBudgetLedger` (create-ledger.ts).
import type { AuditEntry, Page } from "../admin-store.js";
import type { BudgetStore, DailyUsageRecord, PeriodRecord, ReclaimCount } from "../budget-store.js";
import type { KeyMetadata, RateLimits } from "../key-settings.js";
import type { BudgetPeriod } from "../period.js";
import type { HoldDemand } from "../plan-hold.js";
import type { LedgerSettleResult } from "../store-writes.js";
import type { UsageLog } from "../usage/usage-log.js";
import type { UsageCompletionsPage, UsageCompletionsQuery } from "../usage/usage-query.js";

/** An authenticated key, as the service passes it back to checkModel and placeHold. */
export interface KeyInfo {
  /** Public id, `key_` + 12 hex. */
  readonly id: string;
  readonly name: string;
  /** Allowed model ids, or null for every model. */
  readonly models: readonly string[] | null;
  /** The key's hint (`acs-…wxyz`: its prefix and last 4 characters), for messages. */
  readonly hint?: string;
  /** When the key expires (Unix epoch ms); absent: never. placeHold refuses it from then on. */
  readonly expiresAt?: number;
  /** The key's rate limits (src/ratelimit enforces them in the service); absent: none. */
  readonly rateLimits?: RateLimits;
}

/** A placed Hold: the id to renew and settle, and the max_tokens the request may use. */
export interface PlacedHold {
  readonly holdId: string;
  /** max_tokens for the request: as asked, or lower when clamped. */
  readonly maxTokens: number;
  /** True when maxTokens is lower than asked (send `X-Acs-Max-Tokens-Clamped: <maxTokens>`). */
  readonly clamped: boolean;
  /** Tokens held: promptTokens + prompts × n × maxTokens. */
  readonly heldTokens: number;
}

/**
 * Nothing placed: the demand's promptTokens was a bound (`promptTokensBound`) and the demand does
 * not fit whole. Count the prompt exactly and place the Hold again.
 */
export interface CountNeeded {
  readonly countNeeded: true;
}

/** A new key: shown once in clear, never stored. */
export interface CreatedKey {
  readonly id: string;
  /** `acs-` + 43 base64url characters. */
  readonly key: string;
}

/**
 * A key as admins see it (no hash, no key). Times are Unix epoch ms. A key with a Budget period
 * (`day`, `week`, `month`) has `period`, `periodStart` and `resetsAt`, and its numbers are the
 * current period's, as of the ledger's clock (a period that ended since the store last rolled
 * the key over shows spent 0); a key without (`none`) has none of the three.
 */
export interface KeySummary {
  readonly id: string;
  readonly name: string;
  /** `acs-…` + the key's last 4 characters. */
  readonly hint: string;
  /** The Budget (of each period, when the key has one). */
  readonly budgetTokens: number;
  /** Charged (in the current period, when the key has one). */
  readonly spentTokens: number;
  /** How often spent starts again from 0, at the UTC calendar boundary. */
  readonly period?: Exclude<BudgetPeriod, "none">;
  /** Start of the current period (UTC). */
  readonly periodStart?: number;
  /** When spent starts again from 0: the next boundary (UTC). */
  readonly resetsAt?: number;
  readonly models: readonly string[] | null;
  readonly createdAt: number;
  readonly revokedAt: number | null;
  /** Rate limits, or null for none (stored and returned; src/ratelimit enforces them). */
  readonly rateLimits: RateLimits | null;
  /** When the key stops working (Unix epoch ms), or null for never. */
  readonly expiresAt: number | null;
  /** Admin metadata (string → string), or null for none. */
  readonly metadata: KeyMetadata | null;
}

/**
 * The settings an admin gives a key besides its Budget (each checked: key-settings.ts; a
 * KeySettingError names the one that fails). `null` clears a setting.
 */
export interface KeySettings {
  readonly models?: readonly string[] | null;
  readonly rateLimits?: RateLimits | null;
  readonly expiresAt?: number | null;
  readonly metadata?: KeyMetadata | null;
}

/** The changes of `updateKey`: fields left out are kept. */
export interface KeyChanges extends KeySettings {
  readonly name?: string;
  /** Sets the Budget (tokens, integer ≥ 0; not below spent + held + leased). */
  readonly budgetTokens?: number;
  /** Adds to the Budget (tokens, integer ≥ 1), after budgetTokens when both are given. */
  readonly addTokens?: number;
}

/** An admin key as admins see it (no hash, no secret). */
export interface AdminKeyInfo {
  /** `adm_` + 12 hex. */
  readonly id: string;
  readonly name: string;
  /** `acs-admin-…` + the key's last 4 characters. */
  readonly hint: string;
  readonly createdAt: number;
  readonly revokedAt: number | null;
}

/** A new admin key: its secret `acs-admin-` + 43 base64url characters, shown once. */
export interface CreatedAdminKey extends AdminKeyInfo {
  readonly key: string;
}

/** A key's Budget right now, in tokens. */
export interface KeyUsage extends KeySummary {
  /** Σ of the open Holds placed one transaction each (requests in flight). */
  readonly heldTokens: number;
  /**
   * Σ of the live leases: the Holds in flight on gateway replicas that serve the key from memory,
   * their charges not yet flushed (at most one lease sync interval old), and free tokens.
   */
  readonly leasedTokens: number;
  /** budget − spent − held − leased: what the store can still hold or lease. */
  readonly availableTokens: number;
  readonly openHolds: number;
  readonly leases: number;
  readonly settledHolds: number;
  readonly reclaimedHolds: number;
  /** Usage per UTC day, newest first. */
  readonly daily: readonly DailyUsageRecord[];
  /**
   * A key with a Budget period: its past periods, newest first (what each charged, and what of it
   * is still held or leased by requests placed in it).
   */
  readonly periods?: readonly PeriodRecord[];
}

/**
 * The ledger of keys, Budgets and Holds (proto/API.md §9) that the service calls. Every refusal meant
 * for a caller is an ApiError; misuse by the calling code (a negative token count, an unknown
 * Hold id) is a RangeError or an `UnknownIdError` (errors.ts). Methods that reach the store are async.
 */
export interface BudgetLedger {
  /** The instance id written into this ledger's Holds and leases. */
  readonly instanceId: string;
  /** The store's kind: `sqlite` or `postgres`. */
  readonly storeKind: BudgetStore["kind"];
  /** Whether Holds are placed from leases (src/budget/README.md, "Leases"). */
  readonly leased: boolean;
  /**
   * False while the store cannot write: from a write that failed (a full disk, a lock held past
   * the busy timeout, PostgreSQL unreachable) until a write succeeds again and every pending
   * settle is written. The gateway is not ready meanwhile (`/readyz` 503, gRPC health
   * NOT_SERVING). src/budget/README.md, "When the store fails".
   */
  readonly writable: boolean;
  /** Settles the store failed to write, kept and written again in order until it takes them. */
  readonly pendingSettles: number;
  /**
   * The key of an `Authorization` header value (`Bearer <key>`, scheme case-insensitive). Throws
   * ApiError `invalid_api_key` (401, param null) for a missing header, another scheme, an unknown
   * key or a revoked key. A key read from the store is reused for authCacheTtlMs.
   */
  authenticate(authorization: string | undefined): Promise<KeyInfo>;
  /**
   * Throws ApiError `model_not_allowed` (403, param `model`) when the key has an allow-list that
   * names neither modelId nor any of its aliases (so a key made with `--models llama-8b` serves a
   * request for the alias and for the served id it resolves to).
   */
  checkModel(key: KeyInfo, modelId: string, aliases?: readonly string[]): void;
  /**
   * Holds promptTokens + prompts × n × maxTokens of the key's Budget — from this replica's lease
   * when it has room, else in one transaction — lowering maxTokens to what the Budget can hold
   * when it cannot hold it all. Throws ApiError `insufficient_quota` (429) when not one generated
   * token per choice fits (after asking other replicas to give back their leases' free tokens),
   * `invalid_api_key` when the key was revoked meanwhile, `upstream_unavailable` (503, retry
   * after 1 s) when the store fails (nothing is placed: the request must not run), RangeError for
   * numbers out of range.
   */
  placeHold(key: KeyInfo, demand: HoldDemand & { readonly promptTokensBound?: false }): Promise<PlacedHold>;
  /**
   * As above; a demand whose promptTokens is a bound (`promptTokensBound: true`) is placed only
   * whole, else nothing is placed and the answer is {@link CountNeeded}.
   */
  placeHold(key: KeyInfo, demand: HoldDemand): Promise<PlacedHold | CountNeeded>;
  /**
   * Keeps an open Hold alive for ttlMs more (default: the ledger's holdTtlMs) and records
   * usedTokens (prompt + generated so far; the largest recorded wins) as what a reclaim of the Hold
   * charges — so a request whose replica dies is charged what it delivered up to its last renewal.
   * Resolves once that is durable. Returns false when the Hold is no longer open.
   */
  renew(holdId: string, usedTokens?: number, ttlMs?: number): Promise<boolean>;
  /**
   * Whether the Hold's tokens are still the request's to deliver: `true` at once (no promise is
   * made) in the usual case — a Hold in the store with more than a quarter of its Hold TTL left
   * since the store last confirmed it (placed or renewed), or one on a lease this replica renewed
   * within three quarters of the lease's TTL. Otherwise (a stall, or a store that could not be
   * reached, kept this replica from renewing: past the expiry another process may reclaim the Hold
   * or the lease and give its tokens to other requests) the ledger asks the store first:
   * - a store Hold is renewed; one no longer open was reclaimed (charged what its renewals
   *   recorded, the rest given back), and the answer is false;
   * - a lease is stepped; if it was lost, what the Hold may still use is held in the store in one
   *   transaction, whole or not at all, and the Hold moves there (its renewals and its settle
   *   follow); false when the Budget cannot hold that.
   * False: the request must deliver nothing more — its settle then charges what it used, as far as
   * the Budget has tokens free. An answer counts only when read with a quarter of the TTL still
   * ahead (else asked again, 3 times at most). Rejects with the store's error, or when the store
   * does not answer within what is left of the Hold's or lease's life (at least an eighth of its
   * TTL): the caller fails closed. Unknown or ended Holds: `true`. src/budget/README.md, "What a
   * crash costs".
   */
  standing(holdId: string): true | Promise<boolean>;
  /**
   * Ends a Hold: charges the tokens actually used, at most the tokens held, and gives the rest
   * back to the Budget. Exactly once: a repeated settle charges nothing (`already_settled`). A
   * Hold already reclaimed as stale is charged what the Budget still has free. A settle the store
   * fails to write (or asked while others wait) is `pending`: kept and written again, in order,
   * until the store takes it; its Hold stays open (reserved) meanwhile. Throws UnknownIdError for
   * an unknown Hold id, RangeError for a usedTokens that is not an integer ≥ 0.
   */
  settle(holdId: string, usedTokens: number): Promise<LedgerSettleResult>;
  /**
   * Releases every open Hold and lease past its expiry (each charged what its last renewal
   * recorded), and deletes closed Holds older than the retention; returns how many were released.
   */
  reclaimStale(): Promise<ReclaimCount>;
  /**
   * Releases open Holds and leases left by a previous run, as reclaimStale does. `all` (default)
   * releases every one in the store — right for the embedded SQLite store, which serves one
   * gateway process. `instance` releases only this instanceId's (replicas on a shared store, each
   * with a stable instanceId).
   */
  reclaimOnStart(scope?: "all" | "instance"): Promise<ReclaimCount>;
  /** Flushes every lease now (charges, renewals, free tokens of idle leases). */
  syncLeases(): Promise<void>;
  /**
   * The usage log: one record per settled request, queued in memory and written in batches
   * (src/budget/README.md, "Usage records"); flushed by close().
   */
  readonly usageLog: UsageLog;
  /** OpenAI's completions usage over the usage records (../usage/usage-query.ts); throws ApiError 400. */
  usageCompletions(query: UsageCompletionsQuery): Promise<UsageCompletionsPage>;
  /**
   * Stops the timers, writes the usage log's queue, flushes the leases (giving back their free tokens, ending the empty ones),
   * tries the pending settles once more (those still not written are reported to onReclaimError:
   * their Holds are reclaimed later, charged their last renewal) and closes the store. Idempotent.
   */
  close(): Promise<void>;

  /**
   * The admin operations below take the `actor` of their audit row: the admin key id, or `cli`
   * (the default). Each change is one transaction with its audit row. Throws UnknownIdError for
   * an unknown id, KeySettingError (with the param) for a setting that fails its check.
   */
  /**
   * Creates a key with a Budget of budgetTokens (integer ≥ 0), its settings and an optional Budget
   * period (default `none`: the Budget never resets; else budgetTokens is the Budget of each UTC
   * day, ISO week or month; RangeError for another period); the secret is shown once.
   */
  createKey(
    input: { name?: string; budgetTokens: number; period?: BudgetPeriod } & KeySettings,
    actor?: string,
  ): Promise<CreatedKey & KeySummary>;
  /** One key. */
  getKey(id: string): Promise<KeySummary>;
  /** Every key, oldest first. */
  listKeys(): Promise<KeySummary[]>;
  /** A page of keys, newest first (created_at, then id); `limit` 1–100, `after` the last id of the previous page. */
  listKeysPage(page: { after?: string; limit: number }): Promise<Page<KeySummary>>;
  /** Changes a key's name, Budget (set, add), models, rate limits, expiry, metadata. */
  updateKey(id: string, changes: KeyChanges, actor?: string): Promise<KeySummary>;
  /** Adds tokens (integer ≥ 1) to a key's Budget and returns its usage. */
  grant(id: string, tokens: number, actor?: string): Promise<KeyUsage>;
  /**
   * A new secret for the key (same id, Budget, spent and usage). The old secret gets 401 at once
   * on this replica, and within the auth cache's TTL (1 s) on the others: a replica that read the
   * key within the last second still accepts the old secret until its cache entry expires (its
   * lease is the key id's, so it serves it meanwhile). A revoked key cannot be rotated.
   */
  rotateKey(id: string, actor?: string): Promise<CreatedKey & KeySummary>;
  /**
   * Revokes a key: from now on every request with it gets 401. Waits (at most the lease drain
   * wait) until every live replica leasing the key has confirmed it, so that when it resolves no
   * replica places a Hold for the key.
   */
  revoke(id: string, actor?: string): Promise<KeySummary>;
  /** Creates an admin key (`acs-admin-…`), shown once. */
  createAdminKey(input: { name?: string }, actor?: string): Promise<CreatedAdminKey>;
  /**
   * The admin key of an Authorization header (never cached). 401 `invalid_api_key` for none, an
   * unknown or a revoked one; 403 `permission_denied` for a live API key.
   */
  authenticateAdmin(authorization: string | undefined): Promise<AdminKeyInfo>;
  /** Revokes an admin key: refused at once on every replica. */
  revokeAdminKey(id: string, actor?: string): Promise<AdminKeyInfo>;
  /** A page of the audit log, newest first (the order written); `limit` 1–100. */
  listAuditLogs(page: { after?: string; limit: number }): Promise<Page<AuditEntry>>;
  /** A key's Budget, spent, held, leased and available tokens, and its last `days` days (default 31). Throws UnknownIdError. */
  usage(id: string, days?: number): Promise<KeyUsage>;
}
