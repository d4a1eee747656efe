// The SQLite store's statements, prepared once on the migrated database, and how its rows read
// (`models` as JSON text, a boolean as 0 or 1).
import type Database from "better-sqlite3";
import {
  type DailyColumns,
  type HoldColumns,
  KEY_INSERT_COLUMNS,
  type KeyColumns,
  type KeyRow,
  type KeySettingsValues,
  type keyInsertValues,
  keyRowOf,
  type LeaseColumns,
  type LeaseUpdateValues,
  type PeriodColumns,
} from "../rows.js";
import type { prepareAdminStatements } from "./admin-statements.js";
import { BUDGET_SCHEMA_VERSION } from "./schema.js";

/** A `keys` row: `models` is JSON text. */
type KeySqlRow = KeyColumns<string | null>;

/** A boolean column as SQLite stores it (0 or 1: a CHECK keeps it so), read. */
export function fromBit(value: number): boolean {
  return value === 1;
}

/** A boolean as SQLite stores it: 1 or 0. */
export function toBit(value: boolean): number {
  return value ? 1 : 0;
}

/** The {@link KeyRow} of a `keys` row, its JSON `models` parsed. */
export function toKeyRow(row: KeySqlRow): KeyRow {
  return keyRowOf(row, (text) => JSON.parse(text as string));
}

/**
 * The statements on keys, usage and lease flags (see {@link prepareHoldStatements} for Holds and
 * leases), prepared once on the migrated database.
 */
export function prepareKeyStatements(db: Database.Database) {
  return {
    insertKey: db.prepare<ReturnType<typeof keyInsertValues>>(
      `INSERT INTO keys (${KEY_INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ),
    writeKeySettings: db.prepare<KeySettingsValues>(
      `UPDATE keys SET name = ?, budget_tokens = ?, models = ?, rate_limits = ?, expires_at = ?, metadata = ?,
              key_hash = ?, hint = ?, revoked_at = ? WHERE id = ?`,
    ),
    keyByHash: db.prepare<[Buffer], KeySqlRow>("SELECT * FROM keys WHERE key_hash = ?"),
    keyById: db.prepare<[string], KeySqlRow>("SELECT * FROM keys WHERE id = ?"),
    listKeys: db.prepare<[], KeySqlRow>("SELECT * FROM keys ORDER BY created_at, id"),
    openCounts: db.prepare<[string, string], { holds: number; leases: number }>(
      `SELECT (SELECT count(*) FROM holds WHERE key_id = ? AND state = 'open') AS holds,
              (SELECT count(*) FROM leases WHERE key_id = ? AND state = 'open') AS leases`,
    ),
    totals: db.prepare<[string], { settled: number; reclaimed: number }>(
      `SELECT coalesce(sum(settled_holds), 0) AS settled, coalesce(sum(reclaimed_holds), 0) AS reclaimed
       FROM usage_daily WHERE key_id = ?`,
    ),
    daily: db.prepare<[string, number], DailyColumns>(
      `SELECT day, charged_tokens, settled_holds, reclaimed_holds FROM usage_daily
       WHERE key_id = ? ORDER BY day DESC LIMIT ?`,
    ),
    addBudget: db.prepare<[number, string]>("UPDATE keys SET budget_tokens = budget_tokens + ? WHERE id = ?"),
    revoke: db.prepare<[number, string]>("UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?"),
    drainAll: db.prepare<[string]>("UPDATE leases SET drain = 1 WHERE key_id = ? AND state = 'open'"),
    drainOthers: db.prepare<[string, string, number, number]>(
      `UPDATE leases SET drain = 1
       WHERE key_id = ? AND state = 'open' AND instance_id != ? AND expires_at > ? AND tokens > 0 AND closing = 0
         AND period_start = ?`,
    ),
    blockLeases: db.prepare<[number, string]>(
      "UPDATE keys SET lease_block_until = max(lease_block_until, ?) WHERE id = ?",
    ),
    setKeyNumbers: db.prepare<[number, number, number, string]>(
      "UPDATE keys SET spent_tokens = ?, held_tokens = ?, leased_tokens = ? WHERE id = ?",
    ),
    reserve: db.prepare<[number, string, number, number, number], { period_start: number }>(
      `UPDATE keys SET held_tokens = held_tokens + ?
       WHERE id = ? AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)
         AND (period_end = 0 OR period_end > ?)
         AND budget_tokens - spent_tokens - held_tokens - leased_tokens >= ?
       RETURNING period_start`,
    ),
    moveHeld: db.prepare<[number, number, string]>(
      "UPDATE keys SET spent_tokens = spent_tokens + ?, held_tokens = held_tokens - ? WHERE id = ?",
    ),
    addDaily: db.prepare<[string, string, number, number, number]>(
      `INSERT INTO usage_daily (key_id, day, charged_tokens, settled_holds, reclaimed_holds) VALUES (?, ?, ?, ?, ?)
       ON CONFLICT (key_id, day) DO UPDATE SET
         charged_tokens = charged_tokens + excluded.charged_tokens,
         settled_holds = settled_holds + excluded.settled_holds,
         reclaimed_holds = reclaimed_holds + excluded.reclaimed_holds`,
    ),
    drainRequests: db.prepare<[string], { id: string }>(
      "SELECT id FROM leases WHERE instance_id = ? AND state = 'open' AND drain = 1",
    ),
    drainsPending: db.prepare<[string, number, string], { n: number }>(
      `SELECT count(*) AS n FROM leases
       WHERE key_id = ? AND state = 'open' AND drain = 1 AND expires_at > ? AND instance_id != ?`,
    ),
    // A write of the page it is on (page 1) that changes nothing: the probe of a store that failed to write.
    probe: db.prepare(`PRAGMA user_version = ${BUDGET_SCHEMA_VERSION}`),
  };
}

/** The statements on a key's past Budget periods and its rollover, prepared once on the migrated database. */
export function preparePeriodStatements(db: Database.Database) {
  return {
    periodRow: db.prepare<[string, number], PeriodColumns>(
      `SELECT period_start, period_end, budget_tokens, spent_tokens, held_tokens, leased_tokens
       FROM budget_periods WHERE key_id = ? AND period_start = ?`,
    ),
    writePeriod: db.prepare<[string, number, number, number, number, number, number]>(
      `INSERT INTO budget_periods (key_id, period_start, period_end, budget_tokens, spent_tokens, held_tokens, leased_tokens)
       VALUES (?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (key_id, period_start) DO UPDATE SET
         spent_tokens = excluded.spent_tokens, held_tokens = excluded.held_tokens, leased_tokens = excluded.leased_tokens`,
    ),
    rollKey: db.prepare<[number, number, string]>(
      `UPDATE keys SET spent_tokens = 0, held_tokens = 0, leased_tokens = 0, period_start = ?, period_end = ?
       WHERE id = ?`,
    ),
    periods: db.prepare<[string, number], PeriodColumns>(
      `SELECT period_start, period_end, budget_tokens, spent_tokens, held_tokens, leased_tokens
       FROM budget_periods WHERE key_id = ? ORDER BY period_start DESC LIMIT ?`,
    ),
  };
}

/** The statements on Hold and lease rows, prepared once on the migrated database. */
export function prepareHoldStatements(db: Database.Database) {
  return {
    insertHold: db.prepare<[string, string, number, number, number, string, number]>(
      `INSERT INTO holds (id, key_id, tokens, created_at, expires_at, instance_id, period_start)
       VALUES (?, ?, ?, ?, ?, ?, ?)`,
    ),
    renew: db.prepare<[number, number, string]>(
      `UPDATE holds SET expires_at = ?, used_tokens = max(coalesce(used_tokens, 0), ?)
       WHERE id = ? AND state = 'open'`,
    ),
    holdById: db.prepare<[string], HoldColumns>(
      `SELECT id, key_id, tokens, state, used_tokens, charged_tokens, expires_at, period_start
       FROM holds WHERE id = ?`,
    ),
    holdKey: db.prepare<[string], { key_id: string }>("SELECT key_id FROM holds WHERE id = ?"),
    // Only a Hold of its key's current period, with no rollover due (else the general path).
    settleOpen: db.prepare<
      [number, number, number, string, number],
      { key_id: string; tokens: number; charged_tokens: number }
    >(
      `UPDATE holds SET state = 'settled', used_tokens = ?, charged_tokens = min(?, tokens), closed_at = ?
       WHERE id = ? AND state = 'open' AND period_start =
         (SELECT k.period_start FROM keys k WHERE k.id = holds.key_id AND (k.period_end = 0 OR k.period_end > ?))
       RETURNING key_id, tokens, charged_tokens`,
    ),
    closeHold: db.prepare<[string, number, number, number, string]>(
      "UPDATE holds SET state = ?, used_tokens = ?, charged_tokens = ?, closed_at = ? WHERE id = ?",
    ),
    expiredHolds: db.prepare<[number], { id: string; keyId: string }>(
      "SELECT id, key_id AS keyId FROM holds WHERE state = 'open' AND expires_at <= ?",
    ),
    openHolds: db.prepare<[string | null, string | null], { id: string; keyId: string }>(
      "SELECT id, key_id AS keyId FROM holds WHERE state = 'open' AND (? IS NULL OR instance_id = ?)",
    ),
    expiredLeases: db.prepare<[number], { id: string; keyId: string }>(
      "SELECT id, key_id AS keyId FROM leases WHERE state = 'open' AND expires_at <= ?",
    ),
    openLeases: db.prepare<[string | null, string | null], { id: string; keyId: string }>(
      "SELECT id, key_id AS keyId FROM leases WHERE state = 'open' AND (? IS NULL OR instance_id = ?)",
    ),
    leaseById: db.prepare<[string], LeaseColumns<number>>(
      `SELECT id, key_id, state, tokens, reclaim_charge, holds, seq, last_result, drain, closing, expires_at,
              period_start
       FROM leases WHERE id = ?`,
    ),
    insertLease: db.prepare<[string, string, string, number, number, number]>(
      `INSERT INTO leases (id, key_id, instance_id, created_at, expires_at, period_start)
       VALUES (?, ?, ?, ?, ?, ?)`,
    ),
    updateLease: db.prepare<[...LeaseUpdateValues<number>, id: string]>(
      `UPDATE leases SET state = ?, tokens = ?, reclaim_charge = ?, holds = ?, seq = ?, last_result = ?,
              drain = ?, closing = ?, expires_at = ?, closed_at = ? WHERE id = ?`,
    ),
    purgeHolds: db.prepare<[number]>(
      "DELETE FROM holds WHERE id IN (SELECT id FROM holds WHERE state != 'open' AND closed_at < ? LIMIT 10000)",
    ),
    purgeLeases: db.prepare<[number]>(
      "DELETE FROM leases WHERE id IN (SELECT id FROM leases WHERE state != 'open' AND closed_at < ? LIMIT 10000)",
    ),
  };
}

/** Every prepared statement of a store. */
export type Statements = ReturnType<typeof prepareKeyStatements> &
  ReturnType<typeof preparePeriodStatements> &
  ReturnType<typeof prepareHoldStatements> &
  ReturnType<typeof prepareAdminStatements>;
