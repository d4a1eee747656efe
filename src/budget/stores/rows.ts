// The rows of a BudgetStore as the shared transactions (./hold-steps.ts, ./lease-steps.ts,
// ./reclaim.ts) see them, and their columns as both backends' SQL reads and writes them.
import type { DailyUsageRecord, KeyRecord, KeyState, PeriodRecord } from "../budget-store.js";
import { type KeyMetadata, rateLimitsFromJson, rateLimitsToJson } from "../key-settings.js";
import { type BudgetPeriod, nextBoundary, periodStart } from "../period.js";

/** A key row. Times are Unix epoch ms; amounts are tokens. */
export interface KeyRow extends KeyRecord {
  /** Σ tokens of the key's open Holds (not in a lease). */
  readonly heldTokens: number;
  /** Σ tokens of the key's open leases. */
  readonly leasedTokens: number;
  readonly leaseBlockUntil: number;
  readonly period: BudgetPeriod;
  /** Start of the current period (0 for `none`); its counters are spent, held and leased. */
  readonly periodStart: number;
  /** When the current period ends: nextBoundary(period, periodStart); 0 for `none` (never). */
  readonly periodEnd: number;
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
  /** The key's periodStart when the Hold was placed: its charge goes to that period. */
  readonly periodStart: number;
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
  /** The key's periodStart when the lease was taken: its tokens are that period's. */
  readonly periodStart: number;
}

/** The columns a lease step writes: a lease row's but its id and key, and when it was closed. */
export interface LeaseUpdate extends Omit<LeaseRow, "id" | "keyId" | "periodStart"> {
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
  rate_limits: M;
  expires_at: number | null;
  metadata: M;
  period: BudgetPeriod;
  period_start: number;
  period_end: number;
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
  period_start: number;
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
  period_start: number;
}

/** A `budget_periods` row's columns but the key. */
export interface PeriodColumns {
  period_start: number;
  period_end: number;
  budget_tokens: number;
  spent_tokens: number;
  held_tokens: number;
  leased_tokens: number;
}

/** A past period's row as the shared transactions see it (./periods.ts). */
export interface PeriodRow extends PeriodRecord {
  readonly keyId: string;
}

/** The {@link PeriodRecord} of a `budget_periods` row. */
export function periodOf(r: PeriodColumns): PeriodRecord {
  return {
    periodStart: r.period_start,
    periodEnd: r.period_end,
    budgetTokens: r.budget_tokens,
    spentTokens: r.spent_tokens,
    heldTokens: r.held_tokens,
    leasedTokens: r.leased_tokens,
  };
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
 * The {@link KeyRow} of a `keys` row. `json` decodes a JSON column from the backend's own form (see
 * {@link KeyColumns}); the key hash is the row's Buffer as it is.
 */
export function keyRowOf<M>(row: KeyColumns<M>, json: (value: M) => unknown): KeyRow {
  const models = row.models === null ? null : (json(row.models) as string[]);
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
    rateLimits: row.rate_limits === null ? null : rateLimitsFromJson(json(row.rate_limits)),
    expiresAt: row.expires_at,
    metadata: row.metadata === null ? null : (json(row.metadata) as KeyMetadata),
    period: row.period,
    periodStart: row.period_start,
    periodEnd: row.period_end,
  };
}

/** The columns of a key that {@link keyInsertValues} and {@link keySettingsValues} write. */
export const KEY_INSERT_COLUMNS =
  "id, key_hash, hint, name, budget_tokens, spent_tokens, models, created_at, revoked_at, rate_limits, expires_at, metadata, " +
  "period, period_start, period_end";

/** Values of a key row's admin columns, in the order of {@link keySettingsValues}. */
export type KeySettingsValues = [
  name: string,
  budgetTokens: number,
  models: string | null,
  rateLimits: string | null,
  expiresAt: number | null,
  metadata: string | null,
  keyHash: Buffer,
  hint: string,
  revokedAt: number | null,
  id: string,
];

/**
 * The values of a new key's `INSERT INTO keys (KEY_INSERT_COLUMNS)`, in that order: the hash as a
 * Buffer, JSON columns as JSON text (null: none), which both backends store as is (PostgreSQL
 * casts the text to jsonb); the period `none` when absent, its start `periodStart(period,
 * createdAt)` when absent, and its end.
 */
export function keyInsertValues(
  record: KeyRecord,
): [
  string,
  Buffer,
  string,
  string,
  number,
  number,
  string | null,
  number,
  number | null,
  string | null,
  number | null,
  string | null,
  BudgetPeriod,
  number,
  number,
] {
  const v = keySettingsValues(record);
  const period = record.period ?? "none";
  const start = record.periodStart ?? periodStart(period, record.createdAt);
  return [
    record.id,
    v[6],
    record.hint,
    record.name,
    record.budgetTokens,
    record.spentTokens,
    v[2],
    record.createdAt,
    record.revokedAt,
    v[3],
    v[4],
    v[5],
    period,
    start,
    nextBoundary(period, start),
  ];
}

/**
 * The values of `UPDATE keys SET name, budget_tokens, models, rate_limits, expires_at, metadata,
 * key_hash, hint, revoked_at WHERE id`, in that order (JSON columns as JSON text).
 */
export function keySettingsValues(r: KeyRecord): KeySettingsValues {
  return [
    r.name,
    r.budgetTokens,
    r.models === null ? null : JSON.stringify(r.models),
    r.rateLimits == null ? null : JSON.stringify(rateLimitsToJson(r.rateLimits)),
    r.expiresAt ?? null,
    r.metadata == null ? null : JSON.stringify(r.metadata),
    Buffer.from(r.keyHash),
    r.hint,
    r.revokedAt,
    r.id,
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
    periodStart: r.period_start,
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
    periodStart: r.period_start,
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

/** A key row's free tokens: budget − spent − held − leased. */
export const freeOf = (k: KeyRow): number => k.budgetTokens - k.spentTokens - k.heldTokens - k.leasedTokens;

/**
 * The update that writes a lease row back as it is but for `changes` (and its closedAt, which the
 * row does not carry).
 */
export function rewriteLease(
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

/** The {@link KeyState} of a key row (what a lease policy decides from). */
export function keyState(k: KeyRow): KeyState {
  return {
    budgetTokens: k.budgetTokens,
    spentTokens: k.spentTokens,
    heldTokens: k.heldTokens,
    leasedTokens: k.leasedTokens,
    revokedAt: k.revokedAt,
    leaseBlockUntil: k.leaseBlockUntil,
  };
}
