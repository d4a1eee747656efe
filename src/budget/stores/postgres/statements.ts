// The PostgreSQL store's row statements (run by name, so that each connection prepares them once),
// the type parsers of its pool, and how its rows read (jsonb `models` parsed, booleans as they are).
import pg from "pg";
import { ADMIN_KEY_COLUMNS, AUDIT_COLUMNS } from "../admin-rows.js";
import { KEY_INSERT_COLUMNS, type KeyColumns, type KeyRow, keyRowOf } from "../rows.js";

/** bigint, numeric (sums) → number (amounts are safe integers); date → `YYYY-MM-DD`. */
export const TYPES = {
  getTypeParser: ((oid: number, format?: string) => {
    if (oid === pg.types.builtins.INT8 || oid === pg.types.builtins.NUMERIC) return (v: string) => Number(v);
    if (oid === pg.types.builtins.DATE) return (v: string) => v;
    return pg.types.getTypeParser(oid, format as "text");
  }) as typeof pg.types.getTypeParser,
};

/** A `keys` row: jsonb `models` comes parsed. */
export type KeySqlRow = KeyColumns<unknown>;

/** A boolean column as node-postgres returns it, and takes it: as it is. */
export function asBoolean(value: boolean): boolean {
  return value;
}

/** The {@link KeyRow} of a `keys` row. */
export function toKeyRow(row: KeySqlRow): KeyRow {
  return keyRowOf(row, (value) => value);
}

/**
 * The statements of the store's transactions (./transaction.ts) and of renew, run by {@link run} as
 * `acs_<name>`; the store's other statements are written where they run (./store.ts, ./schema.ts).
 */
export const SQL = {
  lockKey: "SELECT * FROM keys WHERE id = $1 FOR UPDATE",
  lockHold: `SELECT id, key_id, tokens, state, used_tokens, charged_tokens, expires_at, period_start
             FROM holds WHERE id = $1 FOR UPDATE`,
  lockLease: `SELECT id, key_id, state, tokens, reclaim_charge, holds, seq, last_result, drain, closing,
              expires_at, period_start FROM leases WHERE id = $1 FOR UPDATE`,
  lockPeriod: `SELECT period_start, period_end, budget_tokens, spent_tokens, held_tokens, leased_tokens
               FROM budget_periods WHERE key_id = $1 AND period_start = $2 FOR UPDATE`,
  writePeriod: `INSERT INTO budget_periods
                  (key_id, period_start, period_end, budget_tokens, spent_tokens, held_tokens, leased_tokens)
                VALUES ($1, $2, $3, $4, $5, $6, $7)
                ON CONFLICT (key_id, period_start) DO UPDATE SET spent_tokens = excluded.spent_tokens,
                  held_tokens = excluded.held_tokens, leased_tokens = excluded.leased_tokens`,
  rollKey: `UPDATE keys SET spent_tokens = 0, held_tokens = 0, leased_tokens = 0, period_start = $2,
            period_end = $3 WHERE id = $1`,
  insertHold: `INSERT INTO holds (id, key_id, tokens, created_at, expires_at, instance_id, period_start)
               VALUES ($1, $2, $3, $4, $5, $6, $7)`,
  closeHold:
    "UPDATE holds SET state = $2, used_tokens = $3, charged_tokens = $4, closed_at = $5 WHERE id = $1",
  insertLease: `INSERT INTO leases (id, key_id, instance_id, created_at, period_start, state, tokens, reclaim_charge,
                holds, seq, last_result, drain, closing, expires_at, closed_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
  updateLease: `UPDATE leases SET state = $2, tokens = $3, reclaim_charge = $4, holds = $5, seq = $6,
                last_result = $7, drain = $8, closing = $9, expires_at = $10, closed_at = $11 WHERE id = $1`,
  setKeyNumbers: "UPDATE keys SET spent_tokens = $2, held_tokens = $3, leased_tokens = $4 WHERE id = $1",
  addDaily: `INSERT INTO usage_daily (key_id, day, charged_tokens, settled_holds, reclaimed_holds)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (key_id, day) DO UPDATE SET
               charged_tokens = usage_daily.charged_tokens + excluded.charged_tokens,
               settled_holds = usage_daily.settled_holds + excluded.settled_holds,
               reclaimed_holds = usage_daily.reclaimed_holds + excluded.reclaimed_holds`,
  drainAll: "UPDATE leases SET drain = true WHERE key_id = $1 AND state = 'open'",
  drainOthers: `UPDATE leases SET drain = true
                WHERE key_id = $1 AND state = 'open' AND instance_id <> $2 AND expires_at > $3 AND tokens > 0
                  AND NOT closing AND period_start = $4`,
  blockLeases: "UPDATE keys SET lease_block_until = greatest(lease_block_until, $2) WHERE id = $1",
  revoke: "UPDATE keys SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1",
  renew: `UPDATE holds SET expires_at = $2, used_tokens = greatest(coalesce(used_tokens, 0), $3)
          WHERE id = $1 AND state = 'open'`,
  holdKey: "SELECT key_id FROM holds WHERE id = $1",
  insertKey: `INSERT INTO keys (${KEY_INSERT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
  writeKeySettings: `UPDATE keys SET name = $1, budget_tokens = $2, models = $3, rate_limits = $4, expires_at = $5,
                     metadata = $6, key_hash = $7, hint = $8, revoked_at = $9 WHERE id = $10`,
  insertAudit: `INSERT INTO audit_logs (${AUDIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
  insertAdminKey: `INSERT INTO admin_keys (${ADMIN_KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)`,
  lockAdminKey: `SELECT ${ADMIN_KEY_COLUMNS} FROM admin_keys WHERE id = $1 FOR UPDATE`,
  revokeAdminKey: "UPDATE admin_keys SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1",
} as const;

/** Runs one of the {@link SQL} statements, as a named (prepared) statement, on a pool or a connection. */
export function run<R extends pg.QueryResultRow>(
  client: pg.Pool | pg.PoolClient,
  name: keyof typeof SQL,
  values: unknown[],
): Promise<pg.QueryResult<R>> {
  return client.query<R>({ name: `acs_${name}`, text: SQL[name], values });
}
