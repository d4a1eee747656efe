// What a backend (./sqlite/, ./postgres/) gives the shared transactions: row access inside one
// transaction (TxRows, with SQLite's one-statement shortcuts) and a few plain statements
// (StoreBackend). ./store-on.ts builds the BudgetStore of a backend from them.
import type { AdminKeyRecord, AuditEntry, Page, PageRequest } from "../admin-store.js";
import type { BudgetStore, DailyUsageRecord, KeyRecord, PeriodRecord } from "../budget-store.js";
import type { HoldRow, KeyRow, LeaseRow, LeaseUpdate, PeriodRow } from "./rows.js";

/**
 * Row access inside one transaction. `lock*` reads a row and keeps it from other writers until the
 * transaction ends (PostgreSQL: `FOR UPDATE`; SQLite: the whole database is locked by `BEGIN
 * IMMEDIATE`). Every transaction locks the key row first, then its Hold or lease rows. Writes
 * return nothing: a backend may send them without waiting (PostgreSQL pipelines them with the
 * COMMIT); a failed write fails the transaction.
 */
/** The admin surface's writes of {@link TxRows} (keys, admin keys, the audit log). */
export type AdminTxRows = Pick<
  TxRows,
  "insertKey" | "writeKeySettings" | "insertAudit" | "insertAdminKey" | "lockAdminKey" | "revokeAdminKeyRow"
>;

export interface TxRows {
  lockKey(id: string): Promise<KeyRow | undefined>;
  lockHold(id: string): Promise<HoldRow | undefined>;
  lockLease(id: string): Promise<LeaseRow | undefined>;
  /** A past period's row of the key (`budget_periods`), locked. */
  lockPeriod(keyId: string, periodStart: number): Promise<PeriodRow | undefined>;
  /** Inserts a past period's row, or writes its numbers when it exists. */
  writePeriod(row: PeriodRow): void;
  /** Starts the key's next period: spent = held = leased = 0, period_start and period_end as given. */
  rollKey(id: string, periodStart: number, periodEnd: number): void;
  insertHold(hold: {
    id: string;
    keyId: string;
    tokens: number;
    createdAt: number;
    expiresAt: number;
    instanceId: string;
    periodStart: number;
  }): void;
  closeHold(
    id: string,
    state: "settled" | "reclaimed",
    usedTokens: number,
    chargedTokens: number,
    closedAt: number,
  ): void;
  insertLease(
    lease: { id: string; keyId: string; instanceId: string; createdAt: number; periodStart: number },
    columns: LeaseUpdate,
  ): void;
  updateLease(id: string, update: LeaseUpdate): void;
  setKeyNumbers(id: string, spent: number, held: number, leased: number): void;
  addDaily(keyId: string, day: string, charged: number, settled: number, reclaimed: number): void;
  /**
   * Flags the key's open leases to drain: all of them, or (with `others`) the live ones of other
   * instances, of the period starting at `periodStart`, that still have tokens and are not already
   * closing. Returns how many.
   */
  flagDrain(
    keyId: string,
    others?: { instanceId: string; now: number; periodStart: number },
  ): Promise<number>;
  blockLeases(keyId: string, until: number): void;
  revoke(keyId: string, now: number): Promise<boolean>;
  /** Inserts a key row (its numbers as the record says, held and leased 0). */
  insertKey(record: KeyRecord): void;
  /** Rewrites a key's admin columns (name, Budget, models, limits, expiry, metadata, hash, hint, revoked_at). */
  writeKeySettings(record: KeyRecord): void;
  insertAudit(entry: AuditEntry): void;
  insertAdminKey(record: AdminKeyRecord): void;
  lockAdminKey(id: string): Promise<AdminKeyRecord | undefined>;
  revokeAdminKeyRow(id: string, revokedAt: number): void;
  /**
   * One-statement steps for the common case of a Hold placed whole and of an open Hold settled,
   * offered by a backend whose transaction locks every row it may touch from its start (SQLite's
   * `BEGIN IMMEDIATE`), so that no row needs locking first. Absent elsewhere (PostgreSQL).
   */
  readonly shortcuts?: TxShortcuts;
}

/** See {@link TxRows.shortcuts}. Each is synchronous: one statement, its effect visible at once. */
export interface TxShortcuts {
  /**
   * Adds `tokens` to the key's held tokens when the key exists, is not revoked, has not expired at
   * `now`, its period does not end by `now` (no rollover due) and has at least `tokens` free
   * (budget − spent − held − leased). Returns the key's periodStart when it did; undefined (nothing
   * changed) if not.
   */
  reserve(keyId: string, tokens: number, now: number): number | undefined;
  /**
   * Settles the Hold when it is open and of its key's current period, which does not end by
   * `closedAt` (no rollover due): state `settled`, used_tokens = usedTokens, charged_tokens =
   * min(usedTokens, tokens), closed_at. Returns its key, tokens and charge; undefined (nothing
   * changed) otherwise.
   */
  settleOpen(
    holdId: string,
    usedTokens: number,
    closedAt: number,
  ): { keyId: string; tokens: number; charged: number } | undefined;
  /** spent += charged and held −= released on the key row. */
  moveHeld(keyId: string, charged: number, released: number): void;
}

/** What a backend provides besides transactions: plain statements, each atomic on its own. */
export interface StoreBackend {
  readonly kind: BudgetStore["kind"];
  /**
   * True when the rows of its transactions offer {@link TxRows.shortcuts} (a transaction locks the
   * whole store from its start).
   */
  readonly shortcuts?: boolean;
  /** Runs fn in one transaction (committed when it resolves, rolled back when it throws). */
  transaction<T>(fn: (rows: TxRows) => Promise<T>): Promise<T>;
  insertKey(record: KeyRecord): Promise<void>;
  findKeyByHash(keyHash: Uint8Array): Promise<KeyRecord | undefined>;
  listKeys(): Promise<KeyRecord[]>;
  getKey(keyId: string): Promise<KeyRecord | undefined>;
  /** Newest first; undefined when `after` is an unknown id. */
  listKeysPage(page: PageRequest): Promise<Page<KeyRecord> | undefined>;
  findAdminKeyByHash(keyHash: Uint8Array): Promise<AdminKeyRecord | undefined>;
  /** Newest first (the order written); undefined when `after` is an unknown id. */
  listAuditPage(page: PageRequest): Promise<Page<AuditEntry> | undefined>;
  /** The key, its open Hold and lease counts and its usage days, read in one snapshot. */
  keyUsage(
    keyId: string,
    days: number,
  ): Promise<
    | {
        key: KeyRow;
        openHolds: number;
        leases: number;
        settledHolds: number;
        reclaimedHolds: number;
        daily: DailyUsageRecord[];
        /** Past periods, newest first, at most `days`. */
        periods: PeriodRecord[];
      }
    | undefined
  >;
  addBudget(keyId: string, tokens: number): Promise<boolean>;
  renewHold(holdId: string, expiresAt: number, usedTokens: number): Promise<boolean>;
  /** The key of a Hold (no lock), to lock the key first. */
  holdKeyId(holdId: string): Promise<string | undefined>;
  /** Open Holds and leases expired at `now`, or (expired undefined) open ones of an instance or all. */
  openItems(
    filter: { expiredAt: number } | { instanceId: string | undefined },
  ): Promise<{ holds: { id: string; keyId: string }[]; leases: { id: string; keyId: string }[] }>;
  drainRequests(instanceId: string): Promise<string[]>;
  drainsPending(keyId: string, now: number, exceptInstanceId: string): Promise<number>;
  purgeClosed(before: number): Promise<number>;
  /** See {@link BudgetStore.probeWrite}. */
  probeWrite(): Promise<void>;
  /** The i-th (1-based) parameter's placeholder in this backend's SQL: `?` (SQLite), `$i` (PostgreSQL). */
  readonly placeholder: (i: number) => string;
  /**
   * Runs one write statement of the shared SQL (./usage-sql.ts): on SQLite a write transaction of
   * the store's write path (grouped with the turn's Holds and settles), on PostgreSQL one
   * autocommitted statement.
   */
  write(sql: string, values: readonly unknown[]): Promise<void>;
  /** Runs one read statement of the shared SQL; its rows. */
  read<T>(sql: string, values: readonly unknown[]): Promise<T[]>;
  close(): Promise<void>;
}
