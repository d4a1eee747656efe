import { hostname } from "node:os";
import { ApiError, type RetryAdvice } from "../errors/index.js";
import {
  apiKeyHint,
  generateApiKey,
  generateHoldId,
  generateKeyId,
  hashApiKey,
  hashesEqual,
  maskApiKey,
  parseAuthorization,
} from "./api-key.js";
import type {
  BudgetStore,
  DailyUsageRecord,
  KeyRecord,
  KeyUsageRecord,
  PlaceHoldInput,
  PlaceHoldOutcome,
  ReclaimCount,
} from "./budget-store.js";
import {
  answeredWithin,
  createLeases,
  DEFAULT_LEASE_SETTINGS,
  type LeaseOptions,
  type LeaseSettings,
  type Leases,
} from "./leases.js";
import { createPostgresBudgetStore } from "./pg-budget-store.js";
import { checkDemand, type HoldDemand } from "./plan-hold.js";
import { createSqliteBudgetStore } from "./sqlite-budget-store.js";
import {
  type LedgerSettleResult,
  type StoreWrites,
  type WritableChange,
  watchStoreWrites,
} from "./store-writes.js";

/**
 * The longest a request may run without renewing its Hold: the API's 14-minute wait for a
 * non-streamed answer plus one minute of margin, in milliseconds.
 */
export const DEFAULT_HOLD_TTL_MS = 15 * 60_000;

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

/** How often the ledger reclaims stale Holds and leases by default, in milliseconds. */
export const DEFAULT_RECLAIM_INTERVAL_MS = 60_000;

/** How long authenticate() trusts a key it read from the store, in milliseconds. */
export const DEFAULT_AUTH_CACHE_TTL_MS = 1000;

/** True for a `postgres://` or `postgresql://` URL (ACS_DB selects PostgreSQL); anything else is a SQLite path. */
export function isPostgresUrl(db: string): boolean {
  return /^postgres(ql)?:\/\//i.test(db);
}

/** Options shared by every way of opening a ledger. */
export interface BudgetLedgerCommonOptions {
  /**
   * Names this replica in every Hold and lease it places (for `reclaimOnStart("instance")` after
   * a restart). @default `${hostname}:${pid}:${random}`
   */
  readonly instanceId?: string;
  /** A Hold's lifetime after placeHold or renew, in ms. @default {@link DEFAULT_HOLD_TTL_MS} */
  readonly holdTtlMs?: number;
  /** The clock, in Unix epoch ms. @default Date.now */
  readonly now?: () => number;
  /**
   * Runs reclaimStale() every this many ms on an unref'd timer; 0 turns the timer off.
   * @default {@link DEFAULT_RECLAIM_INTERVAL_MS}
   */
  readonly reclaimIntervalMs?: number;
  /** Called with each error of a background task (reclaim, lease steps). @default process.emitWarning */
  readonly onReclaimError?: (err: unknown) => void;
  /**
   * How long authenticate() reuses a key read from the store, ms; 0 reads it every time. A key
   * revoked on another replica is refused by placeHold at once, and by authenticate within this.
   * @default {@link DEFAULT_AUTH_CACHE_TTL_MS}
   */
  readonly authCacheTtlMs?: number;
  /**
   * Leases (src/budget/README.md, "Leases"): true or options to turn them on, false for one
   * transaction per Hold. @default true on PostgreSQL, false on SQLite
   */
  readonly leases?: boolean | LeaseOptions;
  /** Closed Holds are kept this long (for a repeated or late settle), then deleted, ms. @default holdTtlMs */
  readonly closedHoldRetentionMs?: number;
  /**
   * Told when the ledger turns not writable (a write of the store failed) and writable again
   * (a write succeeded and every pending settle is written): see {@link BudgetLedger.writable}.
   */
  readonly onWritableChange?: (change: WritableChange) => void;
  /**
   * Most settles kept waiting for the store; past it no Hold is placed in the store (503).
   * @default 10,000 (`MAX_PENDING_SETTLES`)
   */
  readonly maxPendingSettles?: number;
}

/** Options of {@link createBudgetLedger}: a SQLite file, a PostgreSQL URL, or a store of your own. */
export type BudgetLedgerOptions = BudgetLedgerCommonOptions &
  (
    | {
        /** Path of the SQLite file (created when missing). */
        readonly path: string;
        /** busy_timeout of the SQLite store, in ms. @default 5000 */
        readonly busyTimeoutMs?: number;
        /** SQLite `synchronous` of the store. @default "normal" */
        readonly synchronous?: "full" | "normal";
        /** Who runs the store's WAL checkpoints (see SqliteBudgetStoreOptions). @default "worker" */
        readonly walCheckpoint?: "worker" | "automatic";
        /** One COMMIT per event-loop turn's transactions, or one each (see SqliteBudgetStoreOptions). @default "group" */
        readonly commit?: "group" | "each";
      }
    | {
        /** `postgres://…` of the shared database. */
        readonly postgresUrl: string;
        /** Connections of the pool. @default 4 */
        readonly poolSize?: number;
      }
    | { readonly store: BudgetStore }
  );

/** An authenticated key, as the service passes it back to checkModel and placeHold. */
export interface KeyInfo {
  /** Public id, `key_` + 12 hex. */
  readonly id: string;
  readonly name: string;
  /** Allowed model ids, or null for every model. */
  readonly models: readonly string[] | null;
  /** The key's hint (`acs-…wxyz`: its prefix and last 4 characters), for messages. */
  readonly hint?: string;
}

/**
 * 401 `invalid_api_key` for a revoked key, in the same words whether authenticate or placeHold
 * finds it revoked (a revoke on another replica reaches placeHold within the auth cache's TTL).
 */
function revokedKey(hint: string | undefined): ApiError {
  return new ApiError(
    "invalid_api_key",
    `The API key provided${hint === undefined ? "" : ` (${hint})`} has been revoked. Ask the API's operator for a new key.`,
  );
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

/** A key as admins see it (no hash, no key). Times are Unix epoch ms. */
export interface KeySummary {
  readonly id: string;
  readonly name: string;
  /** `acs-…` + the key's last 4 characters. */
  readonly hint: string;
  readonly budgetTokens: number;
  readonly spentTokens: number;
  readonly models: readonly string[] | null;
  readonly createdAt: number;
  readonly revokedAt: number | null;
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
}

/**
 * The ledger of keys, Budgets and Holds (proto/API.md §9) that the service calls. Every refusal meant
 * for a caller is an ApiError; misuse by the calling code (a negative token count, an unknown
 * Hold id) is a RangeError or an {@link UnknownIdError}. Methods that reach the store are async.
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
   * Stops the timers, flushes the leases (giving back their free tokens, ending the empty ones),
   * tries the pending settles once more (those still not written are reported to onReclaimError:
   * their Holds are reclaimed later, charged their last renewal) and closes the store. Idempotent.
   */
  close(): Promise<void>;

  /** Creates a key with a Budget of budgetTokens (integer ≥ 0) and an optional model allow-list. */
  createKey(input: { name?: string; budgetTokens: number; models?: readonly string[] }): Promise<CreatedKey>;
  /** Every key, oldest first. */
  listKeys(): Promise<KeySummary[]>;
  /** Adds tokens (integer ≥ 1) to a key's Budget and returns its usage. Throws UnknownIdError. */
  grant(id: string, tokens: number): Promise<KeyUsage>;
  /**
   * Revokes a key: from now on every request with it gets 401. Waits (at most the lease drain
   * wait) until every live replica leasing the key has confirmed it, so that when it resolves no
   * replica places a Hold for the key. Throws UnknownIdError.
   */
  revoke(id: string): Promise<KeySummary>;
  /** A key's Budget, spent, held, leased and available tokens, and its last `days` days (default 31). Throws UnknownIdError. */
  usage(id: string, days?: number): Promise<KeyUsage>;
}

/** What the ledger knows of one of its Holds in the store (see `storeHolds` in createBudgetLedger). */
type StoreHoldState = { expiresAt: number; ttlMs: number; lost: boolean };

/** Thrown for an id (key or Hold) the store does not know; `kind` says which. */
export class UnknownIdError extends Error {
  override readonly name = "UnknownIdError";
  constructor(
    readonly kind: "key" | "hold",
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

/**
 * 503 `upstream_unavailable` (retry after 1 s) for a request the ledger could not serve because
 * its store failed (`cause`, kept for the logs): `what` says what could not be done. An ApiError
 * (a refusal meant for the caller) passes unchanged.
 */
function storeUnavailable(cause: unknown, what: string): ApiError {
  if (cause instanceof ApiError) return cause;
  return new ApiError(
    "upstream_unavailable",
    `The Budget ledger is unavailable (its store cannot be read or written right now), so ${what}; ` +
      "the request was not run. Retry the request.",
    { cause, retry: { retry: true, afterSeconds: HOLD_RETRY_AFTER_SECONDS } },
  );
}

/** Keys kept by the authentication cache at most. */
const AUTH_CACHE_ENTRIES = 10_000;

const DAY_MS = 86_400_000;
/** The last day utcDay formatted: [start, end) in Unix epoch ms, and its text. */
let lastDay = { start: 0, end: 0, text: "" };

/** `YYYY-MM-DD` (UTC) of a Unix epoch ms (the last day's text is reused: one Date per day, not per call). */
export function utcDay(ms: number): string {
  if (ms >= lastDay.start && ms < lastDay.end) return lastDay.text;
  const text = new Date(ms).toISOString().slice(0, 10);
  if (Number.isSafeInteger(ms)) {
    const start = ms - (((ms % DAY_MS) + DAY_MS) % DAY_MS);
    lastDay = { start, end: start + DAY_MS, text };
  }
  return text;
}

/**
 * What the functions of one ledger share: its store (each write watched), leases and settings,
 * fixed when it opens (times Unix epoch ms, durations ms), and its two maps.
 */
interface LedgerState {
  readonly store: BudgetStore;
  readonly writes: StoreWrites;
  readonly leases: Leases | undefined;
  readonly now: () => number;
  readonly instanceId: string;
  readonly holdTtlMs: number;
  readonly settings: LeaseSettings;
  /** How long closed Holds and leases are kept before they are purged. */
  readonly retentionMs: number;
  readonly authCacheTtlMs: number;
  /**
   * This replica's open Holds in the store (placed there, or moved there from a lost lease), by
   * the id the request knows: the expiry the store last confirmed (Unix epoch ms) and the TTL it
   * was given (ms). {@link BudgetLedger.standing} vouches for one without a look at the store while
   * more than a quarter of that TTL is ahead; `lost` once a renewal found it closed (reclaimed:
   * never vouched for again). Deleted at settle.
   */
  readonly storeHolds: Map<string, StoreHoldState>;
  /** Keys read lately, by the key itself, least recently used first (see authenticate). */
  readonly authCache: Map<string, { record: KeyRecord; at: number }>;
}

/**
 * A Hold in the store, in one transaction (after other replicas gave back their leases' free
 * tokens when it would clamp or refuse).
 */
async function placeInStore(
  l: LedgerState,
  keyId: string,
  demand: HoldDemand,
): Promise<{
  holdId: string;
  outcome: Exclude<PlaceHoldOutcome, { kind: "drain_requested" }>;
  expiresAt: number;
}> {
  const { now, instanceId, holdTtlMs, settings, store } = l;
  const t = now();
  const input: PlaceHoldInput = {
    holdId: generateHoldId(),
    keyId,
    demand,
    instanceId,
    now: t,
    expiresAt: t + holdTtlMs,
    drainOthersUntil: t + settings.blockMs,
  };
  let outcome = await store.placeHold(input);
  let { expiresAt } = input;
  if (outcome.kind === "drain_requested") {
    // Other replicas lease tokens of this key: have their free tokens back, then plan once more.
    await waitForDrains(l, keyId);
    const t2 = now();
    const { drainOthersUntil: _, ...again } = input;
    expiresAt = t2 + holdTtlMs;
    outcome = await store.placeHold({ ...again, now: t2, expiresAt });
  }
  if (outcome.kind === "drain_requested") {
    throw new Error("unreachable: a placeHold without drainOthersUntil asked for a drain");
  }
  return { holdId: input.holdId, outcome, expiresAt };
}

/** {@link BudgetLedger.renew}: on the Hold's lease or in the store; keeps a store Hold's known expiry. */
async function renew(l: LedgerState, holdId: string, usedTokens = 0, ttlMs?: number): Promise<boolean> {
  const { holdTtlMs, now, storeHolds, leases, store } = l;
  const ttl = ttlMs ?? holdTtlMs;
  checkInt("ttlMs", ttl, 1);
  checkInt("usedTokens", usedTokens, 0);
  const expiresAt = now() + ttl;
  // Read before the store answers: a renewal sent while the Hold was still on its lease (lost
  // meanwhile, answered false) says nothing of the store Hold it moved to.
  const inStore = storeHolds.get(holdId);
  const renewed =
    leases?.owns(holdId) === true
      ? await leases.renew(holdId, usedTokens, ttl)
      : await store.renewHold(holdId, expiresAt, usedTokens);
  if (inStore !== undefined && storeHolds.get(holdId) === inStore) {
    if (!renewed) inStore.lost = true;
    else {
      // What the store now has: a renewal writes its expiry as given, shorter ones too.
      inStore.expiresAt = expiresAt;
      inStore.ttlMs = ttl;
    }
  }
  return renewed;
}

/**
 * {@link BudgetLedger.standing} for a Hold in the store near or past the expiry the store last
 * confirmed: renews it. A Hold still open was never reclaimed, so its tokens are still the
 * request's (whatever the stall); one no longer open was reclaimed: false.
 */
async function confirmInStore(l: LedgerState, holdId: string, inStore: StoreHoldState): Promise<boolean> {
  const { now } = l;
  for (let tries = 0; ; tries++) {
    const { ttlMs } = inStore;
    const expiresAt = now() + ttlMs;
    const waitMs = Math.max(inStore.expiresAt - now(), ttlMs / 8);
    const renewed = await answeredWithin(
      renew(l, holdId, 0, ttlMs),
      waitMs,
      () => `Budget store: Hold ${holdId} was not renewed within ${Math.round(waitMs)} ms`,
    );
    if (!renewed) return false;
    // An answer read after the margin (a stall while the renewal was in flight) vouches for nothing.
    if (now() < expiresAt - ttlMs / 4) return true;
    if (tries >= 2) throw new Error(`Hold ${holdId}: the store's answers come too late to vouch for it`);
  }
}

/**
 * {@link BudgetLedger.standing} for a lease-backed Hold this replica could not vouch for: one
 * step of its lease; a lease lost meanwhile (reclaimed, its tokens free for others) hands the
 * Hold to one placed in the store for exactly what it may still use, whole or not at all.
 */
async function confirmLeased(l: LedgerState, leases: Leases, holdId: string): Promise<boolean> {
  const { writes, storeHolds, holdTtlMs, now } = l;
  const standing = await leases.confirm(holdId);
  if (standing.kind === "current") return true;
  if (standing.uncoveredTokens === 0) return true;
  // Exactly uncoveredTokens: uncoveredTokens − 1 as prompt tokens and 1 generated token. A
  // max_tokens of 1 cannot be clamped, so the Hold is whole or `insufficient` (after the other
  // replicas' leases were asked for their free tokens).
  const {
    holdId: storeHoldId,
    outcome,
    expiresAt,
  } = await placeInStore(l, standing.keyId, {
    promptTokens: standing.uncoveredTokens - 1,
    prompts: 1,
    n: 1,
    maxTokens: 1,
  });
  // Revoked meanwhile: nothing more for this key either (the ledger's 401 says so).
  if (outcome.kind === "revoked" || outcome.kind === "unknown_key") throw revokedKey(undefined);
  if (outcome.kind !== "held") return false;
  if (!leases.move(holdId, storeHoldId)) {
    // The local Hold ended meanwhile (reclaimed as stale): give the store's Hold back (kept and
    // written later if the store fails it now).
    await writes.settle(storeHoldId, 0);
    return false;
  }
  const inStore = { expiresAt, ttlMs: holdTtlMs, lost: false };
  storeHolds.set(holdId, inStore);
  // An answer read after the margin (a stall once the Hold was placed) vouches for nothing.
  return now() < expiresAt - holdTtlMs / 4 ? true : confirmInStore(l, holdId, inStore);
}

/** {@link BudgetLedger.reclaimStale}: local lease Holds, then expired store items; purges closed rows. */
async function reclaimStale(l: LedgerState): Promise<ReclaimCount> {
  const { leases, now, store, retentionMs } = l;
  const local = leases?.reclaimLocal() ?? 0;
  const t = now();
  const r = await store.reclaimExpired(t, utcDay(t));
  await store.purgeClosed(t - retentionMs);
  return { holds: r.holds + local, leases: r.leases };
}

/** Waits until no live lease of another replica is still asked to drain on the key (bounded). */
async function waitForDrains(l: LedgerState, keyId: string): Promise<void> {
  const { settings, store, now, instanceId } = l;
  const until = Date.now() + settings.drainWaitMs;
  const pause = Math.max(5, Math.min(25, Math.floor(settings.drainPollMs / 2)));
  while (Date.now() < until && (await store.drainsPending(keyId, now(), instanceId)) > 0) {
    await new Promise((r) => setTimeout(r, pause));
  }
}

/** The key's usage (days: see {@link BudgetLedger.usage}); UnknownIdError for an unknown key. */
async function mustKnowKey(l: LedgerState, id: string, days?: number): Promise<KeyUsage> {
  const { store } = l;
  const usage = await store.keyUsage(id, days);
  if (usage === undefined) throw new UnknownIdError("key", id);
  return toUsage(usage);
}

/** {@link BudgetLedger.authenticate}, through the ledger's cache of keys read lately. */
async function authenticate(l: LedgerState, authorization: string | undefined): Promise<KeyInfo> {
  const { now, authCache, authCacheTtlMs, store } = l;
  const parsed = parseAuthorization(authorization);
  if (parsed.kind === "missing") throw new ApiError("invalid_api_key", NO_KEY_MESSAGE);
  if (parsed.kind === "wrong_scheme") throw new ApiError("invalid_api_key", WRONG_SCHEME_MESSAGE);
  const t = now();
  let record: KeyRecord | undefined;
  // The cache is keyed by the key itself: a hit was matched by its hash when it was read from
  // the store, so a request with a cached key costs no hash (and no store read).
  const cached = authCache.get(parsed.token);
  if (cached !== undefined && t - cached.at < authCacheTtlMs) {
    record = cached.record;
    authCache.delete(parsed.token); // least recently used first
    authCache.set(parsed.token, cached);
  } else {
    if (cached !== undefined) authCache.delete(parsed.token);
    const hash = hashApiKey(parsed.token);
    try {
      record = await store.findKeyByHash(hash);
    } catch (err) {
      throw storeUnavailable(err, "the API key could not be checked");
    }
    if (record !== undefined && !hashesEqual(record.keyHash, hash)) record = undefined;
    if (record !== undefined && authCacheTtlMs > 0) {
      authCache.set(parsed.token, { record, at: t });
      if (authCache.size > AUTH_CACHE_ENTRIES) {
        const oldest = authCache.keys().next().value;
        if (oldest !== undefined) authCache.delete(oldest);
      }
    }
  }
  if (record === undefined) {
    const masked = maskApiKey(parsed.token);
    throw new ApiError(
      "invalid_api_key",
      `Incorrect API key provided${masked === null ? "" : `: ${masked}`}. Check the key, or ask the API's operator for one.`,
    );
  }
  if (record.revokedAt !== null) throw revokedKey(record.hint);
  return { id: record.id, name: record.name, models: record.models, hint: record.hint };
}

/** {@link BudgetLedger.placeHold}: on a lease when it can, else in the store (see {@link heldInStore}). */
async function placeHold(
  l: LedgerState,
  key: KeyInfo,
  demand: HoldDemand,
): Promise<PlacedHold | CountNeeded> {
  const { leases, writes } = l;
  checkDemand(demand);
  if (leases !== undefined) {
    let placed: Awaited<ReturnType<Leases["place"]>>;
    try {
      placed = await leases.place(key.id, demand);
    } catch (err) {
      throw storeUnavailable(err, "no Hold could be placed on the key's Budget");
    }
    if (placed.kind === "held") {
      return {
        holdId: placed.holdId,
        maxTokens: demand.maxTokens,
        clamped: false,
        heldTokens: placed.tokens,
      };
    }
    if (placed.kind === "revoked") throw revokedKey(key.hint);
  }
  if (writes.full) {
    throw storeUnavailable(
      new Error(`${writes.pendingSettles} settles wait for the Budget store`),
      "no Hold could be placed on the key's Budget",
    );
  }
  let placedInStore: Awaited<ReturnType<typeof placeInStore>>;
  try {
    placedInStore = await placeInStore(l, key.id, demand);
  } catch (err) {
    throw storeUnavailable(err, "no Hold could be placed on the key's Budget");
  }
  return heldInStore(l, key, demand, placedInStore);
}

/** The answer of a placeHold for a Hold placed in the store: the Hold, or the refusal it throws. */
function heldInStore(
  l: LedgerState,
  key: KeyInfo,
  demand: HoldDemand,
  placedInStore: Awaited<ReturnType<typeof placeInStore>>,
): PlacedHold | CountNeeded {
  const { storeHolds, holdTtlMs } = l;
  const { holdId, outcome, expiresAt } = placedInStore;
  switch (outcome.kind) {
    case "held":
      storeHolds.set(holdId, { expiresAt, ttlMs: holdTtlMs, lost: false });
      return {
        holdId,
        maxTokens: outcome.maxTokens,
        clamped: outcome.clamped,
        heldTokens: outcome.tokens,
      };
    case "insufficient": {
      const available = outcome.budgetTokens - outcome.spentTokens - outcome.heldTokens;
      throw new ApiError(
        "insufficient_quota",
        `You exceeded your current quota: this request needs at least ${outcome.minimumTokens} tokens ` +
          `(${demand.promptTokens} prompt tokens + ${demand.prompts * demand.n} × 1 generated token` +
          `${demand.captureReplay === true ? ` + ${demand.n * demand.promptTokens} tokens of the capture's replay` : ""}), ` +
          `and the key's Budget has ${Math.max(0, available)} of ${outcome.budgetTokens} tokens left ` +
          `(${outcome.spentTokens} spent, ${outcome.heldTokens} held by requests in flight).`,
        { retry: quotaRetry(outcome) },
      );
    }
    case "count":
      return { countNeeded: true };
    case "revoked":
      throw revokedKey(key.hint);
    case "unknown_key":
      throw new ApiError(
        "invalid_api_key",
        "Incorrect API key provided. Check the key, or ask the API's operator for one.",
      );
  }
}

/** {@link BudgetLedger.standing}: true, or (near its expiry, or on a lease not current) a look at the store. */
function standing(l: LedgerState, holdId: string): true | Promise<boolean> {
  const { storeHolds, now, leases } = l;
  const inStore = storeHolds.get(holdId);
  if (inStore !== undefined) {
    if (inStore.lost) return Promise.resolve(false);
    return now() < inStore.expiresAt - inStore.ttlMs / 4 ? true : confirmInStore(l, holdId, inStore);
  }
  if (leases === undefined || leases.current(holdId)) return true;
  return confirmLeased(l, leases, holdId);
}

/** {@link BudgetLedger.settle}: on the Hold's lease, or written to the store (kept while it fails). */
async function settle(l: LedgerState, holdId: string, usedTokens: number): Promise<LedgerSettleResult> {
  const { storeHolds, leases, writes } = l;
  checkInt("usedTokens", usedTokens, 0);
  storeHolds.delete(holdId);
  if (leases?.owns(holdId) === true) return leases.settle(holdId, usedTokens);
  const result = await writes.settle(holdId, usedTokens);
  if (result === undefined) throw new UnknownIdError("hold", holdId);
  return result;
}

/** {@link BudgetLedger.createKey}: a new key and its record in the store. */
async function createKey(
  l: LedgerState,
  input: Parameters<BudgetLedger["createKey"]>[0],
): Promise<CreatedKey> {
  const { store, now } = l;
  checkInt("budgetTokens", input.budgetTokens, 0);
  const models = input.models === undefined ? null : [...new Set(input.models)];
  if (models?.some((m) => m === "")) throw new RangeError("models: a model id must not be empty");
  const key = generateApiKey();
  const id = generateKeyId();
  await store.insertKey({
    id,
    keyHash: hashApiKey(key),
    hint: apiKeyHint(key),
    name: input.name ?? "",
    budgetTokens: input.budgetTokens,
    spentTokens: 0,
    models,
    createdAt: now(),
    revokedAt: null,
  });
  return { id, key };
}

/** {@link BudgetLedger.revoke}: revokes the key, forgets it in the cache and has its leases back. */
async function revoke(l: LedgerState, id: string): Promise<KeySummary> {
  const { store, now, authCache, leases } = l;
  if (!(await store.revokeKey(id, now()))) throw new UnknownIdError("key", id);
  for (const [hash, entry] of authCache) if (entry.record.id === id) authCache.delete(hash);
  await leases?.drainKey(id);
  await waitForDrains(l, id);
  return toSummary(await mustKnowKey(l, id));
}

/**
 * Opens the ledger on a SQLite file (`path`, created and migrated on open), a PostgreSQL database
 * (`postgresUrl`, migrated on open) or a given store, and starts its timers (unref'd; they never
 * keep the process alive): reclaim, and with leases the lease steps and drain polling. Does not
 * reclaim on its own: the gateway calls reclaimOnStart() once at start-up.
 */
export async function createBudgetLedger(options: BudgetLedgerOptions): Promise<BudgetLedger> {
  const holdTtlMs = options.holdTtlMs ?? DEFAULT_HOLD_TTL_MS;
  checkInt("holdTtlMs", holdTtlMs, 1);
  const rawStore =
    "store" in options
      ? options.store
      : "postgresUrl" in options
        ? await createPostgresBudgetStore({
            url: options.postgresUrl,
            ...(options.poolSize === undefined ? {} : { poolSize: options.poolSize }),
          })
        : createSqliteBudgetStore({
            path: options.path,
            ...(options.busyTimeoutMs === undefined ? {} : { busyTimeoutMs: options.busyTimeoutMs }),
            ...(options.synchronous === undefined ? {} : { synchronous: options.synchronous }),
            ...(options.walCheckpoint === undefined ? {} : { walCheckpoint: options.walCheckpoint }),
            ...(options.commit === undefined ? {} : { commit: options.commit }),
          });
  const now = options.now ?? Date.now;
  const onError =
    options.onReclaimError ??
    ((err: unknown) => process.emitWarning(`Budget ledger: a background task failed: ${String(err)}`));
  const writes = watchStoreWrites(rawStore, {
    now,
    dayOf: utcDay,
    onError,
    ...(options.onWritableChange === undefined ? {} : { onWritableChange: options.onWritableChange }),
    ...(options.maxPendingSettles === undefined ? {} : { maxPendingSettles: options.maxPendingSettles }),
  });
  const { store } = writes;
  const instanceId = options.instanceId ?? `${hostname()}:${process.pid}:${generateKeyId().slice(4)}`;
  const authCacheTtlMs = options.authCacheTtlMs ?? DEFAULT_AUTH_CACHE_TTL_MS;
  const retentionMs = options.closedHoldRetentionMs ?? holdTtlMs;
  const leaseOption = options.leases ?? store.kind === "postgres";
  const settings = {
    ...DEFAULT_LEASE_SETTINGS,
    ...(typeof leaseOption === "object" ? leaseOption : {}),
  };
  const leases: Leases | undefined =
    leaseOption === false
      ? undefined
      : createLeases({ store, instanceId, settings, now, dayOf: utcDay, holdTtlMs, onError, writes });
  const l: LedgerState = {
    store,
    writes,
    leases,
    now,
    instanceId,
    holdTtlMs,
    settings,
    retentionMs,
    authCacheTtlMs,
    storeHolds: new Map(),
    authCache: new Map(),
  };
  let closed = false;

  const timer = startReclaimTimer(l, options.reclaimIntervalMs ?? DEFAULT_RECLAIM_INTERVAL_MS, onError);

  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    if (timer !== undefined) clearInterval(timer);
    try {
      await leases?.close();
      await writes.close();
    } finally {
      await store.close();
    }
  };
  return ledgerApi(l, close);
}

/**
 * Runs reclaimStale on the ledger every `intervalMs` (none when 0), skipping a turn while the last
 * one still runs; a failure goes to onError. The timer is unref'd; undefined when there is none.
 */
function startReclaimTimer(
  l: LedgerState,
  intervalMs: number,
  onError: (err: unknown) => void,
): ReturnType<typeof setInterval> | undefined {
  let reclaiming = false;
  const timer =
    intervalMs > 0
      ? setInterval(() => {
          if (reclaiming) return;
          reclaiming = true;
          reclaimStale(l)
            .catch(onError)
            .finally(() => {
              reclaiming = false;
            });
        }, intervalMs)
      : undefined;
  timer?.unref();
  return timer;
}

/** The BudgetLedger of an open ledger's state; `close` closes it (once). */
function ledgerApi(l: LedgerState, close: () => Promise<void>): BudgetLedger {
  const { store, writes, leases, now, instanceId } = l;
  return {
    instanceId,
    storeKind: store.kind,
    leased: leases !== undefined,
    get writable() {
      return writes.writable;
    },
    get pendingSettles() {
      return writes.pendingSettles;
    },
    authenticate: (authorization) => authenticate(l, authorization),
    checkModel(key, modelId, aliases = []) {
      const allowed = key.models;
      if (allowed !== null && !allowed.includes(modelId) && !aliases.some((a) => allowed.includes(a))) {
        throw new ApiError(
          "model_not_allowed",
          `The API key provided is not allowed to use the model '${modelId}'.`,
          {
            param: "model",
          },
        );
      }
    },
    placeHold: ((key: KeyInfo, demand: HoldDemand) => placeHold(l, key, demand)) as BudgetLedger["placeHold"],
    standing: (holdId) => standing(l, holdId),
    renew: (holdId, usedTokens, ttlMs) => renew(l, holdId, usedTokens, ttlMs),
    settle: (holdId, usedTokens) => settle(l, holdId, usedTokens),
    reclaimStale: () => reclaimStale(l),
    async reclaimOnStart(scope = "all") {
      const t = now();
      return store.reclaimOpen(t, utcDay(t), scope === "instance" ? instanceId : undefined);
    },
    async syncLeases() {
      await leases?.syncAll();
    },
    close,
    createKey: (input) => createKey(l, input),
    async listKeys() {
      return (await store.listKeys()).map(toSummary);
    },
    async grant(id, tokens) {
      checkInt("tokens", tokens, 1);
      if (!(await store.addBudget(id, tokens))) throw new UnknownIdError("key", id);
      return mustKnowKey(l, id);
    },
    revoke: (id) => revoke(l, id),
    usage: (id, days) => mustKnowKey(l, id, days),
  };
}

function toSummary(record: KeySummary): KeySummary {
  return {
    id: record.id,
    name: record.name,
    hint: record.hint,
    budgetTokens: record.budgetTokens,
    spentTokens: record.spentTokens,
    models: record.models,
    createdAt: record.createdAt,
    revokedAt: record.revokedAt,
  };
}

function toUsage(record: KeyUsageRecord): KeyUsage {
  return {
    ...toSummary(record),
    heldTokens: record.heldTokens,
    leasedTokens: record.leasedTokens,
    availableTokens: record.budgetTokens - record.spentTokens - record.heldTokens - record.leasedTokens,
    openHolds: record.openHolds,
    leases: record.leases,
    settledHolds: record.settledHolds,
    reclaimedHolds: record.reclaimedHolds,
    daily: record.daily,
  };
}

function checkInt(name: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`${name} must be an integer ≥ ${min}, got ${value}`);
  }
}
