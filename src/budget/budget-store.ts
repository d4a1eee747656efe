import type { AdminStore } from "./admin-store.js";
import type { KeyRecord } from "./key-record.js";
import type { HoldDemand } from "./plan-hold.js";
import type { UsageAggregateQuery, UsageAggregateRow, UsageRecord } from "./usage/usage-record.js";

export type { KeyRecord } from "./key-record.js";

/** A key's charges on one UTC day (the usage history: settled Holds are not kept). */
export interface DailyUsageRecord {
  /** `YYYY-MM-DD`, UTC. */
  readonly day: string;
  /** Tokens charged that day (settles, lease flushes, reclaims). */
  readonly chargedTokens: number;
  /** Holds settled that day (each one a finished request). */
  readonly settledHolds: number;
  /** Holds (and leases) released by reclaim that day instead of a settle. */
  readonly reclaimedHolds: number;
}

/**
 * A past period of a key (a `budget_periods` row), written when the key rolled over into the next
 * one: what it was charged, and what of it was still held or leased then (Holds and leases placed
 * in it settle to it; their unused tokens go back nowhere). spent + held + leased ≤ budget.
 */
export interface PeriodRecord {
  /** Unix epoch ms (UTC) of the period's start, and of the next one's. */
  readonly periodStart: number;
  readonly periodEnd: number;
  /** The key's Budget when the period ended (later grants go to the periods after it). */
  readonly budgetTokens: number;
  readonly spentTokens: number;
  /** Σ of the period's Holds still open / of its leases still live. */
  readonly heldTokens: number;
  readonly leasedTokens: number;
}

/** A key with its live numbers, as {@link BudgetStore.keyUsage} reads them in one snapshot. */
export interface KeyUsageRecord extends KeyRecord {
  /** Σ tokens of the key's open Holds placed one transaction each (not in a lease). */
  readonly heldTokens: number;
  /** Open Holds placed one transaction each (requests in flight, or stale ones not yet reclaimed). */
  readonly openHolds: number;
  /** Σ tokens of the key's live leases (their Holds in flight, unflushed charges, and free tokens). */
  readonly leasedTokens: number;
  /** Live leases (one per gateway replica that serves the key from memory). */
  readonly leases: number;
  /** Σ over the days of {@link DailyUsageRecord.settledHolds}. */
  readonly settledHolds: number;
  /** Σ over the days of {@link DailyUsageRecord.reclaimedHolds}. */
  readonly reclaimedHolds: number;
  /** Usage per UTC day, newest first (at most the days asked for). */
  readonly daily: readonly DailyUsageRecord[];
  /** The key's past periods, newest first (at most the `days` asked for). */
  readonly periods: readonly PeriodRecord[];
}

/** A key's Budget numbers inside a transaction (what a lease policy decides from). */
export interface KeyState {
  readonly budgetTokens: number;
  readonly spentTokens: number;
  readonly heldTokens: number;
  readonly leasedTokens: number;
  readonly revokedAt: number | null;
  /** No new lease may be granted on the key before this time (set when a replica asked leases to drain). */
  readonly leaseBlockUntil: number;
}

/** The input of {@link BudgetStore.placeHold}. */
export interface PlaceHoldInput {
  readonly holdId: string;
  readonly keyId: string;
  readonly demand: HoldDemand;
  readonly instanceId: string;
  readonly now: number;
  readonly expiresAt: number;
  /**
   * When the Hold does not fit whole (it would be clamped or refused) while live leases of other
   * instances hold tokens of the key: place nothing, flag those leases to give back their free
   * tokens (drain), block new leases on the key until this time, and answer `drain_requested`.
   * Undefined: plan with what is free now.
   */
  readonly drainOthersUntil?: number;
  /**
   * Place the Hold in the period that starts then (a Hold taking over one of a lease of that
   * period, `Leases.move`): against what that period has free, a past one included. Absent: the
   * key's current period.
   */
  readonly periodStart?: number;
}

/** The outcome of {@link BudgetStore.placeHold}. */
export type PlaceHoldOutcome =
  | { readonly kind: "held"; readonly tokens: number; readonly maxTokens: number; readonly clamped: boolean }
  | {
      readonly kind: "insufficient";
      /** The least the request could run with (prompt tokens + one token per choice). */
      readonly minimumTokens: number;
      readonly budgetTokens: number;
      readonly spentTokens: number;
      /** Σ open Holds + Σ live leases: tokens held by requests in flight (here or in other replicas). */
      readonly heldTokens: number;
    }
  | {
      /** Nothing placed: `leases` leases of other replicas were asked to give back free tokens first. */
      readonly kind: "drain_requested";
      readonly leases: number;
    }
  | {
      /** Nothing placed: the demand's prompt tokens are a bound and it did not fit whole (planHold). */
      readonly kind: "count";
    }
  | { readonly kind: "revoked" }
  | { readonly kind: "expired"; readonly expiresAt: number }
  | { readonly kind: "unknown_key" };

/**
 * The outcome of a settle. `settled`: the Hold was open and is now charged. `settled_after_reclaim`:
 * the Hold had been reclaimed as stale (charged what its last renewal recorded); the rest of its
 * charge is capped at what the Budget still has free. `already_settled`: a repeated settle; nothing
 * changed and nothing was charged.
 */
export interface SettleResult {
  readonly outcome: "settled" | "settled_after_reclaim" | "already_settled";
  /** Tokens charged to the Budget by this call (0 for `already_settled`). */
  readonly chargedTokens: number;
  /** Tokens of the Hold given back to the Budget by this call. */
  readonly releasedTokens: number;
}

/** A late charge ({@link BudgetStore.chargeLate}): the Hold it ends, by its id, once. */
export interface LateChargeInput {
  /** The (lease-backed) Hold's id: the store records the charge under it, once. */
  readonly holdId: string;
  readonly keyId: string;
  readonly tokens: number;
  readonly instanceId: string;
  readonly now: number;
  readonly day: string;
  /**
   * Start of the period the Hold was placed in (its lease's, as the store answered it): the charge
   * goes to that period, as far as it has tokens free. Absent: the key's current period.
   */
  readonly periodStart?: number;
}

/**
 * One step of a lease (src/budget/README.md, "Leases"), applied atomically and at most once (a retry
 * with the same `seq` after an unknown outcome changes nothing and returns the first answer).
 */
export interface LeaseSyncInput {
  readonly leaseId: string;
  readonly keyId: string;
  readonly instanceId: string;
  /** Sequence number of this step within the lease, from 1; each step's is one more than the last. */
  readonly seq: number;
  readonly now: number;
  /** `YYYY-MM-DD` (UTC) of `now`, for the per-day usage. */
  readonly day: string;
  /** The lease's new expiry (a replica that stops syncing loses its lease after it). */
  readonly expiresAt: number;
  /** Tokens charged by Holds settled from the lease since the last step: moved from the lease to spent. */
  readonly charge: number;
  /** How many Holds those charges settled. */
  readonly settled: number;
  /**
   * What to charge instead of `charge` when the lease turns out to be lost: the reclaim already
   * charged each Hold's use as its last applied renewal recorded, so only the rest (Σ charge −
   * recorded) is due — capped at what the Budget has free.
   */
  readonly chargeIfLost: number;
  /** Free tokens the lease gives back to the Budget. */
  readonly release: number;
  /**
   * What a reclaim of this lease charges: Σ over its Holds in flight of the tokens their last
   * renewal recorded (≤ the lease's tokens after this step).
   */
  readonly reclaimCharge: number;
  /** Holds in flight on the lease after this step (for usage and the reclaim count). */
  readonly holds: number;
  /** Clears the lease's drain flag (the replica gave back its free tokens). */
  readonly acknowledgeDrain: boolean;
  /**
   * The lease takes no new Holds and gives back what its Holds release at once: it holds only
   * Holds in flight, so a drain request skips it.
   */
  readonly closing: boolean;
  /**
   * Tokens to add to the lease, decided inside the transaction from the key's state and its free
   * tokens after this step (budget − spent − held − leased). The store grants min(result, free) and
   * nothing on a revoked key. Undefined: add nothing.
   */
  readonly grow?: (free: number, key: KeyState) => number;
  /** Ends the lease: any tokens it still has go back to the Budget and its row is removed. */
  readonly close: boolean;
}

/** The period a lease was taken in, as a step answers it (Unix epoch ms). */
export interface LeasePeriod {
  /** Its start: what a late charge of one of the lease's Holds names (LateChargeInput.periodStart). */
  readonly start: number;
  /** Its end: no Hold may be placed on the lease from then on. */
  readonly end: number;
  /**
   * The key rolled over into a later period (the store's clock): the lease takes no new Hold,
   * gives back its free tokens and ends with its last Hold; its charges go to its period.
   */
  readonly past: boolean;
}

/** The outcome of {@link BudgetStore.syncLease}. */
export type LeaseSyncOutcome =
  | {
      readonly kind: "synced";
      /** Tokens added to the lease by `grow`. */
      readonly granted: number;
      /** The lease's tokens after the step (0 once closed). */
      readonly tokens: number;
      /** Another replica (or a revoke) asked this lease to give back its free tokens. */
      readonly drain: boolean;
      readonly key: KeyState;
      /** The lease's period; absent when the key has none (`none`). */
      readonly period?: LeasePeriod;
    }
  | {
      /**
       * The lease is gone: reclaimed after its expiry by another replica, or at start. Its last
       * reclaimCharge was charged then; this step's `chargeIfLost` was charged up to what the
       * Budget had free (`charged`), and nothing else was applied.
       */
      readonly kind: "lost";
      readonly charged: number;
    }
  | { readonly kind: "unknown_key" };

/** What a reclaim released. */
export interface ReclaimCount {
  /** Open Holds released (each charged what its last renewal recorded). */
  readonly holds: number;
  /** Leases released (each charged its reclaimCharge). */
  readonly leases: number;
}

/**
 * Where keys, Budgets, Holds and leases live: SQLite (embedded) or PostgreSQL (shared by gateway
 * replicas). Every method is one atomic step (one transaction), so that several callers — threads,
 * processes, or gateway replicas on a shared store — never overspend a Budget. Amounts are tokens
 * (safe integers); times are Unix epoch milliseconds. Both stores pass one test suite
 * (test/budget/store-contract.test.ts).
 */
export interface BudgetStore extends AdminStore {
  /** `sqlite` or `postgres`. */
  readonly kind: "sqlite" | "postgres";
  /** Adds a key. Throws when the id or the hash already exists. */
  insertKey(record: KeyRecord): Promise<void>;
  /** The key whose hash is `keyHash`, revoked or not. */
  findKeyByHash(keyHash: Uint8Array): Promise<KeyRecord | undefined>;
  /** Every key, oldest first. */
  listKeys(): Promise<KeyRecord[]>;
  /** One key with its open Holds, leases and the usage of its last `days` days (default 31); undefined for an unknown id. */
  keyUsage(keyId: string, days?: number): Promise<KeyUsageRecord | undefined>;
  /** Adds `tokens` to the Budget; false for an unknown id. */
  addBudget(keyId: string, tokens: number): Promise<boolean>;
  /**
   * Marks the key revoked at `now` (a second revoke keeps the first time) and flags every lease on
   * it to drain; false for an unknown id.
   */
  revokeKey(keyId: string, now: number): Promise<boolean>;
  /**
   * In one transaction: reads the Budget's free tokens (budget − spent − held − leased), plans the
   * Hold with planHold, and inserts it when it fits.
   */
  placeHold(input: PlaceHoldInput): Promise<PlaceHoldOutcome>;
  /**
   * Moves an open Hold's expiry to `expiresAt` and records `usedTokens` (the most recorded so far
   * wins) as what a reclaim charges; false when the Hold is not open (or unknown).
   */
  renewHold(holdId: string, expiresAt: number, usedTokens: number): Promise<boolean>;
  /**
   * Settles a Hold to `usedTokens`: charges min(usedTokens, held) and releases the rest, once.
   * Undefined for an unknown Hold id (or one purged after `closedHoldRetention`).
   */
  settleHold(holdId: string, usedTokens: number, now: number, day: string): Promise<SettleResult | undefined>;
  /**
   * Charges up to `tokens` to a key, at most what its Budget has free (budget − spent − held −
   * leased), and counts one settled Hold; returns the tokens charged. For a Hold that ended after
   * its lease was lost (or after it was reclaimed as stale on its replica). Once per Hold id: the
   * charge is recorded as a closed Hold row of that id, and a repeat (a retry whose first answer
   * was lost) charges nothing and returns 0.
   */
  chargeLate(input: LateChargeInput): Promise<number>;
  /** One step of a lease: see {@link LeaseSyncInput}. */
  syncLease(input: LeaseSyncInput): Promise<LeaseSyncOutcome>;
  /** Ids of `instanceId`'s leases flagged to drain. */
  drainRequests(instanceId: string): Promise<string[]>;
  /** Live leases on the key (of instances other than `exceptInstanceId`) still flagged to drain. */
  drainsPending(keyId: string, now: number, exceptInstanceId?: string): Promise<number>;
  /**
   * Releases every open Hold and lease past its expiry, each charged what its last renewal recorded
   * (a Hold: its used tokens; a lease: its reclaimCharge), the rest given back.
   */
  reclaimExpired(now: number, day: string): Promise<ReclaimCount>;
  /**
   * Releases, as reclaimExpired does, every open Hold and lease of `instanceId`, or every one at all
   * when `instanceId` is undefined.
   */
  reclaimOpen(now: number, day: string, instanceId?: string): Promise<ReclaimCount>;
  /** Deletes Holds and leases closed (settled, reclaimed) before `before`; returns how many. */
  purgeClosed(before: number): Promise<number>;
  /**
   * Commits a write that changes nothing the ledger reads (SQLite: rewrites the schema version, one
   * page to the WAL; PostgreSQL: a transaction that takes a transaction id, one commit record), to
   * learn whether the store can write again after a write failed. Throws what the store throws.
   */
  probeWrite(): Promise<void>;
  /**
   * Appends usage records (src/budget/usage/): one multi-row INSERT per 500 rows; on SQLite in the
   * write path's group commit. Throws when the store cannot write (nothing of that INSERT is kept).
   */
  insertUsage(records: readonly UsageRecord[]): Promise<void>;
  /** The sums of the usage records per bucket and group ({@link UsageAggregateQuery}), GROUP BY in SQL. */
  usageAggregate(query: UsageAggregateQuery): Promise<UsageAggregateRow[]>;
  /** Closes the store; later calls throw. */
  close(): Promise<void>;
}
