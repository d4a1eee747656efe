// The shared store: a PostgreSQL database (node-postgres pool) that several gateway replicas use at
// once, the shared transactions of ../store-on.ts over its rows (./transaction.ts).
import pg from "pg";
import type { BudgetStore, KeyRecord } from "../../budget-store.js";
import type { StoreBackend } from "../backend.js";
import { type DailyColumns, dailyOf, keyInsertValues, type PeriodColumns, periodOf } from "../rows.js";
import { createBudgetStoreOn } from "../store-on.js";
import { adminReads } from "./admin-reads.js";
import { migrate } from "./schema.js";
import { type KeySqlRow, run, SQL, TYPES, toKeyRow } from "./statements.js";
import { inTransaction, rowsOf } from "./transaction.js";

/** Options of {@link createPostgresBudgetStore}. */
export interface PostgresBudgetStoreOptions {
  /** `postgres://user@host:port/database` (or `postgresql://…`); libpq's URL form, as node-postgres parses it. */
  readonly url: string;
  /**
   * Connections in the pool. Leases keep the hot path in memory, so a few connections serve a
   * gateway replica; more help only when many requests fall back to one transaction per Hold.
   * @default 4
   */
  readonly poolSize?: number;
  /** How long to wait for a connection, ms. @default 10000 */
  readonly connectTimeoutMs?: number;
  /**
   * How long one statement may wait for its answer, ms; then it fails (ApiError 500 for the
   * request that asked) and its connection is dropped. A server that went silent (a partition
   * drops the packets; the TCP connection stays open) would otherwise hold requests until TCP gives
   * up, many minutes later. @default 30000
   */
  readonly queryTimeoutMs?: number;
  /**
   * How long the server lets one of this store's sessions sit idle inside a transaction, ms
   * (PostgreSQL's `idle_in_transaction_session_timeout`); then it ends the session and its row
   * locks go. A replica stalled mid-transaction (a pause, a partition) would otherwise hold the
   * key's row locks, and every other replica's Holds, settles and reclaims on that key would wait
   * until it ran again. Our transactions take milliseconds. @default 10000
   */
  readonly idleInTransactionTimeoutMs?: number;
  /** Told of an error of an idle connection (the pool replaces it). @default process.emitWarning */
  readonly onIdleError?: (err: Error) => void;
}

/** {@link StoreBackend.keyUsage} on a connection, inside a read-only snapshot transaction. */
async function readKeyUsage(
  c: pg.PoolClient,
  keyId: string,
  days: number,
): ReturnType<StoreBackend["keyUsage"]> {
  const key = (await c.query<KeySqlRow>("SELECT * FROM keys WHERE id = $1", [keyId])).rows[0];
  if (key === undefined) return undefined;
  const counts = (
    await c.query<{ holds: number; leases: number; settled: number; reclaimed: number }>(
      `SELECT (SELECT count(*) FROM holds WHERE key_id = $1 AND state = 'open') AS holds,
              (SELECT count(*) FROM leases WHERE key_id = $1 AND state = 'open') AS leases,
              (SELECT coalesce(sum(settled_holds), 0) FROM usage_daily WHERE key_id = $1) AS settled,
              (SELECT coalesce(sum(reclaimed_holds), 0) FROM usage_daily WHERE key_id = $1) AS reclaimed`,
      [keyId],
    )
  ).rows[0];
  const daily = (
    await c.query<DailyColumns>(
      `SELECT day, charged_tokens, settled_holds, reclaimed_holds FROM usage_daily
       WHERE key_id = $1 ORDER BY day DESC LIMIT $2`,
      [keyId, days],
    )
  ).rows;
  const periods = (
    await c.query<PeriodColumns>(
      `SELECT period_start, period_end, budget_tokens, spent_tokens, held_tokens, leased_tokens
       FROM budget_periods WHERE key_id = $1 ORDER BY period_start DESC LIMIT $2`,
      [keyId, days],
    )
  ).rows;
  return {
    key: toKeyRow(key),
    openHolds: counts?.holds ?? 0,
    leases: counts?.leases ?? 0,
    settledHolds: counts?.settled ?? 0,
    reclaimedHolds: counts?.reclaimed ?? 0,
    daily: daily.map(dailyOf),
    periods: periods.map(periodOf),
  };
}

/** {@link StoreBackend.openItems}: the open Holds, then the open leases, that the filter picks. */
async function openItems(
  pool: pg.Pool,
  filter: Parameters<StoreBackend["openItems"]>[0],
): ReturnType<StoreBackend["openItems"]> {
  const [where, values] =
    "expiredAt" in filter
      ? ["expires_at <= $1", [filter.expiredAt]]
      : filter.instanceId === undefined
        ? ["true", []]
        : ["instance_id = $1", [filter.instanceId]];
  /** The open rows of `table` that the filter picks: id and key. */
  const open = async (table: "holds" | "leases") =>
    (
      await pool.query<{ id: string; keyId: string }>(
        `SELECT id, key_id AS "keyId" FROM ${table} WHERE state = 'open' AND ${where}`,
        values,
      )
    ).rows;
  const holds = await open("holds");
  return { holds, leases: await open("leases") };
}

/** {@link StoreBackend.purgeClosed}: closed Holds, then closed leases, up to 10,000 of each. */
async function purgeClosed(pool: pg.Pool, before: number): Promise<number> {
  /** Deletes up to 10,000 rows of `table` closed before `before`; returns how many. */
  const purge = async (table: "holds" | "leases") =>
    (
      await pool.query(
        `DELETE FROM ${table} WHERE id IN
             (SELECT id FROM ${table} WHERE state <> 'open' AND closed_at < $1 LIMIT 10000)`,
        [before],
      )
    ).rowCount ?? 0;
  const holds = await purge("holds");
  return holds + (await purge("leases"));
}

/** The StoreBackend of a migrated pool: its plain statements and its transactions (see {@link rowsOf}). */
function postgresBackend(pool: pg.Pool): StoreBackend {
  return {
    kind: "postgres",
    transaction: (fn) => inTransaction(pool, "BEGIN", (c, sent) => fn(rowsOf(c, sent))),
    async insertKey(record: KeyRecord) {
      await pool.query(SQL.insertKey, keyInsertValues(record));
    },
    async findKeyByHash(keyHash) {
      const r = (
        await pool.query<KeySqlRow>({
          name: "acs_keyByHash",
          text: "SELECT * FROM keys WHERE key_hash = $1",
          values: [Buffer.from(keyHash)],
        })
      ).rows[0];
      return r === undefined ? undefined : toKeyRow(r);
    },
    async listKeys() {
      return (await pool.query<KeySqlRow>("SELECT * FROM keys ORDER BY created_at, id")).rows.map(toKeyRow);
    },
    ...adminReads(pool),
    keyUsage: (keyId, days) =>
      inTransaction(pool, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", (c) =>
        readKeyUsage(c, keyId, days),
      ),
    async addBudget(keyId, tokens) {
      const r = await pool.query("UPDATE keys SET budget_tokens = budget_tokens + $2 WHERE id = $1", [
        keyId,
        tokens,
      ]);
      return r.rowCount === 1;
    },
    async renewHold(holdId, expiresAt, usedTokens) {
      return ((await run(pool, "renew", [holdId, expiresAt, usedTokens])).rowCount ?? 0) === 1;
    },
    async holdKeyId(holdId) {
      return (await run<{ key_id: string }>(pool, "holdKey", [holdId])).rows[0]?.key_id;
    },
    openItems: (filter) => openItems(pool, filter),
    async drainRequests(instanceId) {
      const r = await pool.query<{ id: string }>({
        name: "acs_drainRequests",
        text: "SELECT id FROM leases WHERE instance_id = $1 AND state = 'open' AND drain",
        values: [instanceId],
      });
      return r.rows.map((row) => row.id);
    },
    async drainsPending(keyId, now, exceptInstanceId) {
      const r = await pool.query<{ n: number }>({
        name: "acs_drainsPending",
        text: `SELECT count(*) AS n FROM leases
               WHERE key_id = $1 AND state = 'open' AND drain AND expires_at > $2 AND instance_id <> $3`,
        values: [keyId, now, exceptInstanceId],
      });
      return r.rows[0]?.n ?? 0;
    },
    purgeClosed: (before) => purgeClosed(pool, before),
    async probeWrite() {
      // A transaction id makes COMMIT write (and flush) a commit record: a write of no table.
      await inTransaction(pool, "BEGIN", async (c) => {
        await c.query("SELECT txid_current()");
      });
    },
    placeholder: (i) => `$${i}`,
    async write(sql, values) {
      await pool.query(sql, [...values]);
    },
    async read<T>(sql: string, values: readonly unknown[]) {
      return (await pool.query(sql, [...values])).rows as T[];
    },
    async close() {
      await pool.end();
    },
  };
}

/**
 * The shared store: a PostgreSQL database (ACS_DB=postgres://…) that several gateway replicas use
 * at once. Every write is one transaction that locks the key's row first (`SELECT … FOR UPDATE`),
 * so replicas never overspend a Budget whatever the interleaving; a CHECK keeps spent + held +
 * leased ≤ budget as a last line of defence. Opening it applies the versioned migrations (one
 * transaction under an advisory lock, so replicas starting together migrate once) and refuses a
 * database whose schema is newer than this code. Use a database (or a schema, through the URL's
 * `options=-c search_path=…`) of its own: the tables are `keys`, `holds`, `leases`, `usage_daily`,
 * `budget_periods`, `usage_records`, `admin_keys`, `audit_logs` and `budget_schema_migrations`.
 */
export async function createPostgresBudgetStore(options: PostgresBudgetStoreOptions): Promise<BudgetStore> {
  const pool = new pg.Pool({
    connectionString: options.url,
    max: options.poolSize ?? 4,
    connectionTimeoutMillis: options.connectTimeoutMs ?? 10_000,
    query_timeout: options.queryTimeoutMs ?? 30_000,
    idle_in_transaction_session_timeout: options.idleInTransactionTimeoutMs ?? 10_000,
    // TCP keepalive finds a silent server of an idle connection too (the pool then replaces it).
    keepAlive: true,
    application_name: "acs-gateway",
    pipeline: true,
    types: TYPES,
  });
  const onIdleError =
    options.onIdleError ?? ((err: Error) => process.emitWarning(`Budget store (PostgreSQL): ${err.message}`));
  pool.on("error", onIdleError);
  try {
    await migrate(pool);
  } catch (err) {
    await pool.end();
    throw err;
  }
  return createBudgetStoreOn(postgresBackend(pool));
}
