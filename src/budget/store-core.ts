// The transactions of a BudgetStore, written once for every backend (SQLite, PostgreSQL): each
// backend gives row access inside a transaction (TxRows) and a few plain statements
// (StoreBackend); the arithmetic and the rules live here, so both stores behave alike.
import type {
  BudgetStore,
  DailyUsageRecord,
  KeyRecord,
  KeyState,
  KeyUsageRecord,
  LateChargeInput,
  LeaseSyncInput,
  LeaseSyncOutcome,
  PlaceHoldInput,
  PlaceHoldOutcome,
  ReclaimCount,
  SettleResult,
} from "./budget-store.js";
import { checkDemand, demandTokens, planHold } from "./plan-hold.js";

/** A key row. Times are Unix epoch ms; amounts are tokens. */
export interface KeyRow extends KeyRecord {
  /** Σ tokens of the key's open Holds (not in a lease). */
  readonly heldTokens: number;
  /** Σ tokens of the key's open leases. */
  readonly leasedTokens: number;
  readonly leaseBlockUntil: number;
}

/** A Hold row. */
export interface HoldRow {
  readonly id: string;
  readonly keyId: string;
  readonly tokens: number;
  readonly state: "open" | "settled" | "reclaimed";
  /** Tokens used as last recorded (by a renew or the settle); null before any. */
  readonly usedTokens: number | null;
  readonly chargedTokens: number;
  readonly expiresAt: number;
}

/** A lease row. */
export interface LeaseRow {
  readonly id: string;
  readonly keyId: string;
  readonly state: "open" | "closed" | "reclaimed";
  readonly tokens: number;
  readonly reclaimCharge: number;
  readonly holds: number;
  /** The last step applied. */
  readonly seq: number;
  /** The last step's answer: tokens granted (open, closed) or charged (reclaimed). */
  readonly lastResult: number;
  readonly drain: boolean;
  readonly closing: boolean;
  readonly expiresAt: number;
}

/** The columns a lease step writes: a lease row's but its id and key, and when it was closed. */
export interface LeaseUpdate extends Omit<LeaseRow, "id" | "keyId"> {
  /** Unix epoch ms when the step closes or reclaims the lease; null while it stays open. */
  readonly closedAt: number | null;
}

// The rows as both backends' SQL reads and writes them (snake_case columns; amounts are tokens,
// times Unix epoch ms). What differs between the two is a type parameter: how a backend returns
// `models` (PostgreSQL jsonb: the parsed array; SQLite: the JSON text) and a boolean (PostgreSQL:
// boolean; SQLite: 0 or 1).

/** A `keys` row (`SELECT * FROM keys`); `M` is how the backend returns `models`, null for every model. */
export interface KeyColumns<M> {
  id: string;
  key_hash: Buffer;
  hint: string;
  name: string;
  budget_tokens: number;
  spent_tokens: number;
  held_tokens: number;
  leased_tokens: number;
  lease_block_until: number;
  models: M;
  created_at: number;
  revoked_at: number | null;
}

/** The columns of a `holds` row that {@link HoldRow} holds. */
export interface HoldColumns {
  id: string;
  key_id: string;
  tokens: number;
  state: HoldRow["state"];
  used_tokens: number | null;
  charged_tokens: number;
  expires_at: number;
}

/** The columns of a `leases` row that {@link LeaseRow} holds; `B` is how the backend returns a boolean. */
export interface LeaseColumns<B> {
  id: string;
  key_id: string;
  state: LeaseRow["state"];
  tokens: number;
  reclaim_charge: number;
  holds: number;
  seq: number;
  last_result: number;
  drain: B;
  closing: B;
  expires_at: number;
}

/** A `usage_daily` row's columns but the key (day `YYYY-MM-DD`, UTC). */
export interface DailyColumns {
  day: string;
  charged_tokens: number;
  settled_holds: number;
  reclaimed_holds: number;
}

/**
 * The values a lease step writes, in the column order `state, tokens, reclaim_charge, holds, seq,
 * last_result, drain, closing, expires_at, closed_at` (both backends' statements take them so);
 * `B` is a boolean as the backend stores it.
 */
export type LeaseUpdateValues<B> = [
  state: LeaseRow["state"],
  tokens: number,
  reclaimCharge: number,
  holds: number,
  seq: number,
  lastResult: number,
  drain: B,
  closing: B,
  expiresAt: number,
  closedAt: number | null,
];

/**
 * The {@link KeyRow} of a `keys` row. `models` is the row's model list already decoded (the
 * backend's own form, see {@link KeyColumns}); the key hash is the row's Buffer as it is.
 */
export function keyRowOf(row: KeyColumns<unknown>, models: string[] | null): KeyRow {
  return {
    id: row.id,
    keyHash: row.key_hash,
    hint: row.hint,
    name: row.name,
    budgetTokens: row.budget_tokens,
    spentTokens: row.spent_tokens,
    heldTokens: row.held_tokens,
    leasedTokens: row.leased_tokens,
    leaseBlockUntil: row.lease_block_until,
    models,
    createdAt: row.created_at,
    revokedAt: row.revoked_at,
  };
}

/**
 * The values of a new key's `INSERT INTO keys (id, key_hash, hint, name, budget_tokens,
 * spent_tokens, models, created_at, revoked_at)`, in that order: the hash as a Buffer, the models
 * as JSON text (null for every model), which both backends store as is (PostgreSQL casts the text
 * to jsonb).
 */
export function keyInsertValues(
  record: KeyRecord,
): [string, Buffer, string, string, number, number, string | null, number, number | null] {
  return [
    record.id,
    Buffer.from(record.keyHash),
    record.hint,
    record.name,
    record.budgetTokens,
    record.spentTokens,
    record.models === null ? null : JSON.stringify(record.models),
    record.createdAt,
    record.revokedAt,
  ];
}

/** The {@link HoldRow} of a `holds` row. */
export function holdRowOf(r: HoldColumns): HoldRow {
  return {
    id: r.id,
    keyId: r.key_id,
    tokens: r.tokens,
    state: r.state,
    usedTokens: r.used_tokens,
    chargedTokens: r.charged_tokens,
    expiresAt: r.expires_at,
  };
}

/** The {@link LeaseRow} of a `leases` row; `flag` reads one of the backend's booleans. */
export function leaseRowOf<B>(r: LeaseColumns<B>, flag: (value: B) => boolean): LeaseRow {
  return {
    id: r.id,
    keyId: r.key_id,
    state: r.state,
    tokens: r.tokens,
    reclaimCharge: r.reclaim_charge,
    holds: r.holds,
    seq: r.seq,
    lastResult: r.last_result,
    drain: flag(r.drain),
    closing: flag(r.closing),
    expiresAt: r.expires_at,
  };
}

/** The values of a lease step (see {@link LeaseUpdateValues}); `flag` writes a boolean as the backend stores it. */
export function leaseUpdateValues<B>(u: LeaseUpdate, flag: (value: boolean) => B): LeaseUpdateValues<B> {
  return [
    u.state,
    u.tokens,
    u.reclaimCharge,
    u.holds,
    u.seq,
    u.lastResult,
    flag(u.drain),
    flag(u.closing),
    u.expiresAt,
    u.closedAt,
  ];
}

/** The {@link DailyUsageRecord} of a `usage_daily` row. */
export function dailyOf(r: DailyColumns): DailyUsageRecord {
  return {
    day: r.day,
    chargedTokens: r.charged_tokens,
    settledHolds: r.settled_holds,
    reclaimedHolds: r.reclaimed_holds,
  };
}

/**
 * The error of a database whose schema `version` is newer than `known`, the version this code
 * writes (both backends refuse to open such a database).
 */
export function schemaTooNewError(version: number, known: number): Error {
  return new Error(`Budget database schema version ${version} is newer than this code knows (${known})`);
}

/**
 * Row access inside one transaction. `lock*` reads a row and keeps it from other writers until the
 * transaction ends (PostgreSQL: `FOR UPDATE`; SQLite: the whole database is locked by `BEGIN
 * IMMEDIATE`). Every transaction locks the key row first, then its Hold or lease rows. Writes
 * return nothing: a backend may send them without waiting (PostgreSQL pipelines them with the
 * COMMIT); a failed write fails the transaction.
 */
export interface TxRows {
  lockKey(id: string): Promise<KeyRow | undefined>;
  lockHold(id: string): Promise<HoldRow | undefined>;
  lockLease(id: string): Promise<LeaseRow | undefined>;
  insertHold(hold: {
    id: string;
    keyId: string;
    tokens: number;
    createdAt: number;
    expiresAt: number;
    instanceId: string;
  }): void;
  closeHold(
    id: string,
    state: "settled" | "reclaimed",
    usedTokens: number,
    chargedTokens: number,
    closedAt: number,
  ): void;
  insertLease(
    lease: { id: string; keyId: string; instanceId: string; createdAt: number },
    columns: LeaseUpdate,
  ): void;
  updateLease(id: string, update: LeaseUpdate): void;
  setKeyNumbers(id: string, spent: number, held: number, leased: number): void;
  addDaily(keyId: string, day: string, charged: number, settled: number, reclaimed: number): void;
  /**
   * Flags the key's open leases to drain: all of them, or (with `others`) the live ones of other
   * instances that still have tokens and are not already closing. Returns how many.
   */
  flagDrain(keyId: string, others?: { instanceId: string; now: number }): Promise<number>;
  blockLeases(keyId: string, until: number): void;
  revoke(keyId: string, now: number): Promise<boolean>;
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
   * Adds `tokens` to the key's held tokens when the key exists, is not revoked and has at least
   * `tokens` free (budget − spent − held − leased). Returns whether it did; nothing changes if not.
   */
  reserve(keyId: string, tokens: number): boolean;
  /**
   * Settles the Hold when it is open: state `settled`, used_tokens = usedTokens, charged_tokens =
   * min(usedTokens, tokens), closed_at. Returns its key, tokens and charge; undefined (nothing
   * changed) when the Hold is unknown or not open.
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
  close(): Promise<void>;
}

type Item = { readonly id: string; readonly keyId: string };
/** Whether an item expiring at expiresAt is (still) to be reclaimed, checked under its lock. */
type Due = (expiresAt: number) => boolean;

const freeOf = (k: KeyRow): number => k.budgetTokens - k.spentTokens - k.heldTokens - k.leasedTokens;

/**
 * The update that writes a lease row back as it is but for `changes` (and its closedAt, which the
 * row does not carry).
 */
function rewriteLease(
  lease: LeaseRow,
  changes: Partial<Omit<LeaseUpdate, "closedAt">> & Pick<LeaseUpdate, "closedAt">,
): LeaseUpdate {
  return {
    state: lease.state,
    tokens: lease.tokens,
    reclaimCharge: lease.reclaimCharge,
    holds: lease.holds,
    seq: lease.seq,
    lastResult: lease.lastResult,
    drain: lease.drain,
    closing: lease.closing,
    expiresAt: lease.expiresAt,
    ...changes,
  };
}

function keyState(k: KeyRow): KeyState {
  return {
    budgetTokens: k.budgetTokens,
    spentTokens: k.spentTokens,
    heldTokens: k.heldTokens,
    leasedTokens: k.leasedTokens,
    revokedAt: k.revokedAt,
    leaseBlockUntil: k.leaseBlockUntil,
  };
}

/** Releases one open Hold, charging what its last renewal recorded. */
async function reclaimHold(rows: TxRows, item: Item, now: number, day: string, due: Due) {
  const [key, hold] = await Promise.all([rows.lockKey(item.keyId), rows.lockHold(item.id)]);
  if (key === undefined || hold === undefined || hold.state !== "open" || !due(hold.expiresAt)) return false;
  const { keyId, id: holdId } = item;
  const charged = Math.min(hold.usedTokens ?? 0, hold.tokens);
  rows.closeHold(holdId, "reclaimed", hold.usedTokens ?? 0, charged, now);
  rows.setKeyNumbers(keyId, key.spentTokens + charged, key.heldTokens - hold.tokens, key.leasedTokens);
  rows.addDaily(keyId, day, charged, 0, 1);
  return true;
}

/** Releases one open lease, charging its reclaimCharge. */
async function reclaimLease(rows: TxRows, item: Item, now: number, day: string, due: Due) {
  const [key, lease] = await Promise.all([rows.lockKey(item.keyId), rows.lockLease(item.id)]);
  if (key === undefined || lease === undefined || lease.state !== "open" || !due(lease.expiresAt))
    return false;
  const { keyId, id: leaseId } = item;
  rows.updateLease(leaseId, rewriteLease(lease, { state: "reclaimed", expiresAt: now, closedAt: now }));
  rows.setKeyNumbers(
    keyId,
    key.spentTokens + lease.reclaimCharge,
    key.heldTokens,
    key.leasedTokens - lease.tokens,
  );
  rows.addDaily(keyId, day, lease.reclaimCharge, 0, lease.holds);
  return true;
}

/** Reclaims items one transaction (of `tx`) each (a Hold's or lease's key locked first). */
async function reclaimItems(
  tx: StoreBackend["transaction"],
  items: Awaited<ReturnType<StoreBackend["openItems"]>>,
  now: number,
  day: string,
  due: Due,
): Promise<ReclaimCount> {
  let holds = 0;
  let leases = 0;
  for (const h of items.holds) if (await tx((rows) => reclaimHold(rows, h, now, day, due))) holds++;
  for (const l of items.leases) if (await tx((rows) => reclaimLease(rows, l, now, day, due))) leases++;
  return { holds, leases };
}

/** Inserts the Hold of a placeHold input, of `tokens` (the key row is the caller's to update). */
function insertHold(rows: TxRows, input: PlaceHoldInput, tokens: number): void {
  rows.insertHold({
    id: input.holdId,
    keyId: input.keyId,
    tokens,
    createdAt: input.now,
    expiresAt: input.expiresAt,
    instanceId: input.instanceId,
  });
}

/** Settles a Hold of keyId, the key row locked first then the Hold's. */
async function settleLocked(
  rows: TxRows,
  keyId: string,
  holdId: string,
  usedTokens: number,
  now: number,
  day: string,
): Promise<SettleResult | undefined> {
  const [key, hold] = await Promise.all([rows.lockKey(keyId), rows.lockHold(holdId)]);
  if (key === undefined || hold === undefined) return undefined;
  if (hold.state === "settled") return { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
  const wanted = Math.min(usedTokens, hold.tokens);
  if (hold.state === "open") {
    rows.closeHold(holdId, "settled", usedTokens, wanted, now);
    rows.setKeyNumbers(keyId, key.spentTokens + wanted, key.heldTokens - hold.tokens, key.leasedTokens);
    rows.addDaily(keyId, day, wanted, 1, 0);
    return { outcome: "settled", chargedTokens: wanted, releasedTokens: hold.tokens - wanted };
  }
  // Reclaimed as stale (charged what its last renewal recorded), then settled late: the rest
  // of its tokens went back to the Budget and may be held by other requests since, so the
  // rest of its charge is capped at what is still free.
  const extra = Math.min(Math.max(0, wanted - hold.chargedTokens), Math.max(0, freeOf(key)));
  rows.closeHold(holdId, "settled", usedTokens, hold.chargedTokens + extra, now);
  rows.setKeyNumbers(keyId, key.spentTokens + extra, key.heldTokens, key.leasedTokens);
  rows.addDaily(keyId, day, extra, 1, 0);
  return { outcome: "settled_after_reclaim", chargedTokens: extra, releasedTokens: 0 };
}

/** A step of a lease that is gone: its charge, up to what is free; recorded for a retry. */
async function lost(rows: TxRows, key: KeyRow, input: LeaseSyncInput, lease: LeaseRow | undefined) {
  const charged = Math.min(input.chargeIfLost, Math.max(0, freeOf(key)));
  rows.setKeyNumbers(input.keyId, key.spentTokens + charged, key.heldTokens, key.leasedTokens);
  if (charged > 0 || input.settled > 0) rows.addDaily(input.keyId, input.day, charged, input.settled, 0);
  if (lease !== undefined) {
    const step = { seq: input.seq, lastResult: charged, expiresAt: input.now, closedAt: input.now };
    rows.updateLease(lease.id, rewriteLease(lease, step));
  }
  return { kind: "lost", charged } as const;
}

/** The KeyUsageRecord of what {@link StoreBackend.keyUsage} read; undefined for an unknown key. */
function usageRecordOf(u: Awaited<ReturnType<StoreBackend["keyUsage"]>>): KeyUsageRecord | undefined {
  if (u === undefined) return undefined;
  const { key } = u;
  return {
    id: key.id,
    keyHash: key.keyHash,
    hint: key.hint,
    name: key.name,
    budgetTokens: key.budgetTokens,
    spentTokens: key.spentTokens,
    models: key.models,
    createdAt: key.createdAt,
    revokedAt: key.revokedAt,
    heldTokens: key.heldTokens,
    openHolds: u.openHolds,
    leasedTokens: key.leasedTokens,
    leases: u.leases,
    settledHolds: u.settledHolds,
    reclaimedHolds: u.reclaimedHolds,
    daily: u.daily,
  };
}

/** {@link BudgetStore.revokeKey} inside its transaction: revokes the key and has all its leases drain. */
async function revokeIn(rows: TxRows, keyId: string, now: number): Promise<boolean> {
  if (!(await rows.revoke(keyId, now))) return false;
  await rows.flagDrain(keyId);
  return true;
}

/** {@link BudgetStore.placeHold} inside its transaction. */
async function placeHoldIn(rows: TxRows, input: PlaceHoldInput): Promise<PlaceHoldOutcome> {
  if (rows.shortcuts !== undefined) {
    // The demand fits whole: what planHold answers when need ≤ available, in one statement.
    checkDemand(input.demand);
    const need = demandTokens(input.demand);
    if (rows.shortcuts.reserve(input.keyId, need)) {
      insertHold(rows, input, need);
      return { kind: "held", tokens: need, maxTokens: input.demand.maxTokens, clamped: false };
    }
  }
  const key = await rows.lockKey(input.keyId);
  if (key === undefined) return { kind: "unknown_key" };
  if (key.revokedAt !== null) return { kind: "revoked" };
  const plan = planHold(freeOf(key), input.demand);
  if (plan.kind === "count") return { kind: "count" };
  if ((plan.kind === "insufficient" || plan.clamped) && input.drainOthersUntil !== undefined) {
    // Other replicas' leases may hold free tokens: have them back before clamping or refusing.
    const leases = await rows.flagDrain(input.keyId, { instanceId: input.instanceId, now: input.now });
    if (leases > 0) {
      rows.blockLeases(input.keyId, input.drainOthersUntil);
      return { kind: "drain_requested", leases };
    }
  }
  if (plan.kind === "insufficient") {
    return {
      kind: "insufficient",
      minimumTokens: plan.minimumTokens,
      budgetTokens: key.budgetTokens,
      spentTokens: key.spentTokens,
      heldTokens: key.heldTokens + key.leasedTokens,
    };
  }
  insertHold(rows, input, plan.tokens);
  rows.setKeyNumbers(input.keyId, key.spentTokens, key.heldTokens + plan.tokens, key.leasedTokens);
  return { kind: "held", tokens: plan.tokens, maxTokens: plan.maxTokens, clamped: plan.clamped };
}

/**
 * {@link BudgetStore.settleHold} inside a transaction of a backend with shortcuts: an open Hold
 * settled in one statement, any other by {@link settleLocked}.
 */
async function settleShortcutIn(
  rows: TxRows,
  holdId: string,
  usedTokens: number,
  now: number,
  day: string,
): Promise<SettleResult | undefined> {
  const s = rows.shortcuts;
  const open = s?.settleOpen(holdId, usedTokens, now);
  if (s !== undefined && open !== undefined) {
    // What settleLocked does with an open Hold, the Hold's row already settled.
    s.moveHeld(open.keyId, open.charged, open.tokens);
    rows.addDaily(open.keyId, day, open.charged, 1, 0);
    return {
      outcome: "settled",
      chargedTokens: open.charged,
      releasedTokens: open.tokens - open.charged,
    };
  }
  const hold = await rows.lockHold(holdId);
  return hold === undefined ? undefined : settleLocked(rows, hold.keyId, holdId, usedTokens, now, day);
}

/**
 * {@link BudgetStore.settleHold}: one transaction; without shortcuts the Hold's key is read first
 * (no lock) so that the transaction locks the key row before the Hold's.
 */
async function settleHold(
  backend: StoreBackend,
  holdId: string,
  usedTokens: number,
  now: number,
  day: string,
): Promise<SettleResult | undefined> {
  if (backend.shortcuts) {
    return backend.transaction((rows) => settleShortcutIn(rows, holdId, usedTokens, now, day));
  }
  const keyId = await backend.holdKeyId(holdId);
  if (keyId === undefined) return undefined;
  return backend.transaction((rows) => settleLocked(rows, keyId, holdId, usedTokens, now, day));
}

/** {@link BudgetStore.chargeLate} inside its transaction: returns the tokens charged. */
async function chargeLateIn(rows: TxRows, input: LateChargeInput): Promise<number> {
  const { keyId, holdId, tokens, now, day } = input;
  const key = await rows.lockKey(keyId);
  if (key === undefined) return 0;
  // Written before: a retry whose first answer was lost charges nothing.
  if ((await rows.lockHold(holdId)) !== undefined) return 0;
  const charged = Math.min(tokens, Math.max(0, freeOf(key)));
  rows.setKeyNumbers(keyId, key.spentTokens + charged, key.heldTokens, key.leasedTokens);
  rows.addDaily(keyId, day, charged, 1, 0);
  // The charge's record: a closed Hold row of that id (purged after the retention, as any).
  const held = Math.max(1, tokens);
  rows.insertHold({
    id: holdId,
    keyId,
    tokens: held,
    createdAt: now,
    expiresAt: now,
    instanceId: input.instanceId,
  });
  rows.closeHold(holdId, "settled", tokens, charged, now);
  return charged;
}

/**
 * {@link BudgetStore.syncLease} inside its transaction: finds the lease (a first step makes a new
 * one), answers a lost lease or a retried step, refuses a step out of order (throws), and applies
 * the next step by {@link applyLeaseStep}.
 */
async function syncLeaseIn(rows: TxRows, input: LeaseSyncInput): Promise<LeaseSyncOutcome> {
  const [key, locked] = await Promise.all([rows.lockKey(input.keyId), rows.lockLease(input.leaseId)]);
  if (key === undefined) return { kind: "unknown_key" };
  let lease = locked;
  const isNew = lease === undefined;
  if (lease === undefined) {
    // A lease's first step creates its row, unless it is granted nothing.
    if (input.seq !== 1) return lost(rows, key, input, undefined);
    lease = {
      id: input.leaseId,
      keyId: input.keyId,
      state: "open",
      tokens: 0,
      reclaimCharge: 0,
      holds: 0,
      seq: 0,
      lastResult: 0,
      drain: false,
      closing: false,
      expiresAt: input.expiresAt,
    };
  }
  if (lease.keyId !== input.keyId) throw new Error(`lease ${input.leaseId} is not a lease of ${input.keyId}`);
  if (lease.state === "reclaimed") {
    if (lease.seq === input.seq) return { kind: "lost", charged: lease.lastResult };
    return lost(rows, key, input, lease);
  }
  if (lease.seq === input.seq) {
    // A retry of the step last applied (its answer was lost): answer as then.
    return {
      kind: "synced",
      granted: lease.lastResult,
      tokens: lease.tokens,
      drain: lease.drain,
      key: keyState(key),
    };
  }
  if (lease.state === "closed" || lease.seq !== input.seq - 1) {
    throw new Error(
      `lease ${input.leaseId}: step ${input.seq} out of order (${lease.state}, last step ${lease.seq})`,
    );
  }
  return applyLeaseStep(rows, key, lease, isNew, input);
}

/**
 * Applies the lease step that follows `lease`'s last (the key and lease rows locked): charges and
 * releases tokens, grows the lease by what `input.grow` asks (up to what is free) or closes it,
 * and writes the lease row (inserted when `isNew` and it holds tokens), the key's numbers and the
 * day's usage. Throws when charge + release exceed the lease's tokens.
 */
function applyLeaseStep(
  rows: TxRows,
  key: KeyRow,
  lease: LeaseRow,
  isNew: boolean,
  input: LeaseSyncInput,
): LeaseSyncOutcome {
  const { charge, release } = input;
  if (charge + release > lease.tokens) {
    throw new Error(
      `lease ${input.leaseId}: charge ${charge} + release ${release} > its ${lease.tokens} tokens`,
    );
  }
  let tokens = lease.tokens - charge - release;
  const spent = key.spentTokens + charge;
  let leased = key.leasedTokens - charge - release;
  let granted = 0;
  if (input.grow !== undefined && key.revokedAt === null && !input.close) {
    const free = key.budgetTokens - spent - key.heldTokens - leased;
    const state: KeyState = { ...keyState(key), spentTokens: spent, leasedTokens: leased };
    granted = Math.max(0, Math.min(Math.floor(input.grow(free, state)), free));
    tokens += granted;
    leased += granted;
  }
  if (input.close) {
    leased -= tokens;
    tokens = 0;
  }
  const drain = input.acknowledgeDrain ? false : lease.drain;
  const update: LeaseUpdate = {
    state: input.close ? "closed" : "open",
    tokens,
    reclaimCharge: input.close ? 0 : Math.min(input.reclaimCharge, tokens),
    holds: input.close ? 0 : input.holds,
    seq: input.seq,
    lastResult: granted,
    drain,
    closing: input.closing,
    expiresAt: input.expiresAt,
    closedAt: input.close ? input.now : null,
  };
  if (!isNew) rows.updateLease(input.leaseId, update);
  else if (tokens > 0) {
    rows.insertLease(
      { id: input.leaseId, keyId: input.keyId, instanceId: input.instanceId, createdAt: input.now },
      update,
    );
  }
  rows.setKeyNumbers(input.keyId, spent, key.heldTokens, leased);
  if (charge > 0 || input.settled > 0) rows.addDaily(input.keyId, input.day, charge, input.settled, 0);
  return {
    kind: "synced",
    granted,
    tokens,
    drain,
    key: { ...keyState(key), spentTokens: spent, leasedTokens: leased },
  };
}

/** The BudgetStore of a backend: every rule of Holds, leases and reclaim, one transaction each. */
export function createBudgetStoreOn(backend: StoreBackend): BudgetStore {
  const tx = backend.transaction.bind(backend);
  return {
    kind: backend.kind,
    insertKey: (record) => backend.insertKey(record),
    findKeyByHash: (hash) => backend.findKeyByHash(hash),
    listKeys: () => backend.listKeys(),
    keyUsage: async (keyId, days = 31) => usageRecordOf(await backend.keyUsage(keyId, days)),
    addBudget: (keyId, tokens) => backend.addBudget(keyId, tokens),
    revokeKey: (keyId, now) => tx((rows) => revokeIn(rows, keyId, now)),
    placeHold: (input) => tx((rows) => placeHoldIn(rows, input)),
    renewHold: (holdId, expiresAt, usedTokens) => backend.renewHold(holdId, expiresAt, usedTokens),
    settleHold: (holdId, usedTokens, now, day) => settleHold(backend, holdId, usedTokens, now, day),
    chargeLate: (input) => tx((rows) => chargeLateIn(rows, input)),
    syncLease: (input) => tx((rows) => syncLeaseIn(rows, input)),
    drainRequests: (instanceId) => backend.drainRequests(instanceId),
    drainsPending: (keyId, now, exceptInstanceId) =>
      backend.drainsPending(keyId, now, exceptInstanceId ?? ""),

    async reclaimExpired(now, day) {
      return reclaimItems(tx, await backend.openItems({ expiredAt: now }), now, day, (e) => e <= now);
    },

    async reclaimOpen(now, day, instanceId) {
      return reclaimItems(tx, await backend.openItems({ instanceId }), now, day, () => true);
    },

    purgeClosed: (before) => backend.purgeClosed(before),
    probeWrite: () => backend.probeWrite(),
    close: () => backend.close(),
  };
}
