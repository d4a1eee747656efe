import pg from "pg";
import type { BudgetStore, KeyRecord } from "./budget-store.js";
import {
  createBudgetStoreOn,
  type DailyColumns,
  dailyOf,
  type HoldColumns,
  holdRowOf,
  type KeyColumns,
  type KeyRow,
  keyInsertValues,
  keyRowOf,
  type LeaseColumns,
  leaseRowOf,
  leaseUpdateValues,
  type StoreBackend,
  schemaTooNewError,
  type TxRows,
} from "./store-core.js";

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

const MIGRATIONS: readonly string[] = [
  // 0 → 1
  `
  CREATE TABLE keys (
    id                text PRIMARY KEY,
    key_hash          bytea NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
    hint              text NOT NULL,
    name              text NOT NULL DEFAULT '',
    budget_tokens     bigint NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens      bigint NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0),
    held_tokens       bigint NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    leased_tokens     bigint NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    lease_block_until bigint NOT NULL DEFAULT 0,
    models            jsonb CHECK (models IS NULL OR jsonb_typeof(models) = 'array'),
    created_at        bigint NOT NULL,
    revoked_at        bigint,
    CHECK (spent_tokens + held_tokens + leased_tokens <= budget_tokens)
  );
  CREATE TABLE holds (
    id             text PRIMARY KEY,
    key_id         text NOT NULL REFERENCES keys(id),
    tokens         bigint NOT NULL CHECK (tokens > 0),
    created_at     bigint NOT NULL,
    expires_at     bigint NOT NULL,
    instance_id    text NOT NULL,
    state          text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'settled', 'reclaimed')),
    used_tokens    bigint CHECK (used_tokens IS NULL OR used_tokens >= 0),
    charged_tokens bigint NOT NULL DEFAULT 0 CHECK (charged_tokens >= 0 AND charged_tokens <= tokens),
    closed_at      bigint
  );
  CREATE INDEX holds_open_by_key ON holds (key_id) WHERE state = 'open';
  CREATE INDEX holds_open_by_expiry ON holds (expires_at) WHERE state = 'open';
  CREATE INDEX holds_open_by_instance ON holds (instance_id) WHERE state = 'open';
  CREATE INDEX holds_closed ON holds (closed_at) WHERE state <> 'open';
  CREATE TABLE leases (
    id             text PRIMARY KEY,
    key_id         text NOT NULL REFERENCES keys(id),
    instance_id    text NOT NULL,
    state          text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'reclaimed')),
    tokens         bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    reclaim_charge bigint NOT NULL DEFAULT 0 CHECK (reclaim_charge >= 0 AND reclaim_charge <= tokens),
    holds          bigint NOT NULL DEFAULT 0 CHECK (holds >= 0),
    seq            bigint NOT NULL DEFAULT 0,
    last_result    bigint NOT NULL DEFAULT 0,
    drain          boolean NOT NULL DEFAULT false,
    closing        boolean NOT NULL DEFAULT false,
    created_at     bigint NOT NULL,
    expires_at     bigint NOT NULL,
    closed_at      bigint
  );
  CREATE INDEX leases_open_by_key ON leases (key_id) WHERE state = 'open';
  CREATE INDEX leases_open_by_expiry ON leases (expires_at) WHERE state = 'open';
  CREATE INDEX leases_open_by_instance ON leases (instance_id) WHERE state = 'open';
  CREATE INDEX leases_closed ON leases (closed_at) WHERE state <> 'open';
  CREATE TABLE usage_daily (
    key_id          text NOT NULL REFERENCES keys(id),
    day             date NOT NULL,
    charged_tokens  bigint NOT NULL DEFAULT 0,
    settled_holds   bigint NOT NULL DEFAULT 0,
    reclaimed_holds bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, day)
  );
  `,
];

/** The schema version this code writes on PostgreSQL (table `budget_schema_migrations`). */
export const POSTGRES_BUDGET_SCHEMA_VERSION: number = MIGRATIONS.length;

/** pg_advisory_xact_lock key that serializes migrations of replicas starting at once. */
const MIGRATION_LOCK = 0x616373_627564; // "acs" "bud"

/** bigint, numeric (sums) → number (amounts are safe integers); date → `YYYY-MM-DD`. */
const TYPES = {
  getTypeParser: ((oid: number, format?: string) => {
    if (oid === pg.types.builtins.INT8 || oid === pg.types.builtins.NUMERIC) return (v: string) => Number(v);
    if (oid === pg.types.builtins.DATE) return (v: string) => v;
    return pg.types.getTypeParser(oid, format as "text");
  }) as typeof pg.types.getTypeParser,
};

/** A `keys` row: jsonb `models` comes parsed. */
type KeySqlRow = KeyColumns<string[] | null>;

/** A boolean column as node-postgres returns it, and takes it: as it is. */
function asBoolean(value: boolean): boolean {
  return value;
}

const SQL = {
  lockKey: "SELECT * FROM keys WHERE id = $1 FOR UPDATE",
  lockHold: `SELECT id, key_id, tokens, state, used_tokens, charged_tokens, expires_at
             FROM holds WHERE id = $1 FOR UPDATE`,
  lockLease: `SELECT id, key_id, state, tokens, reclaim_charge, holds, seq, last_result, drain, closing,
              expires_at FROM leases WHERE id = $1 FOR UPDATE`,
  insertHold: `INSERT INTO holds (id, key_id, tokens, created_at, expires_at, instance_id)
               VALUES ($1, $2, $3, $4, $5, $6)`,
  closeHold:
    "UPDATE holds SET state = $2, used_tokens = $3, charged_tokens = $4, closed_at = $5 WHERE id = $1",
  insertLease: `INSERT INTO leases (id, key_id, instance_id, created_at, state, tokens, reclaim_charge, holds, seq,
                last_result, drain, closing, expires_at, closed_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
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
                  AND NOT closing`,
  blockLeases: "UPDATE keys SET lease_block_until = greatest(lease_block_until, $2) WHERE id = $1",
  revoke: "UPDATE keys SET revoked_at = coalesce(revoked_at, $2) WHERE id = $1",
  renew: `UPDATE holds SET expires_at = $2, used_tokens = greatest(coalesce(used_tokens, 0), $3)
          WHERE id = $1 AND state = 'open'`,
  holdKey: "SELECT key_id FROM holds WHERE id = $1",
} as const;

/** Runs one of the {@link SQL} statements, as a named (prepared) statement, on a pool or a connection. */
function run<R extends pg.QueryResultRow>(
  client: pg.Pool | pg.PoolClient,
  name: keyof typeof SQL,
  values: unknown[],
): Promise<pg.QueryResult<R>> {
  return client.query<R>({ name: `acs_${name}`, text: SQL[name], values });
}

/** Row access on one connection; writes are sent at once (pipelined) and collected in `sent`. */
function rowsOf(c: pg.PoolClient, sent: Promise<unknown>[]): TxRows {
  const write = (name: keyof typeof SQL, values: unknown[]): void => {
    const p = run(c, name, values);
    p.catch(() => undefined); // seen by the transaction's Promise.all(sent), not unhandled meanwhile
    sent.push(p);
  };
  return {
    async lockKey(id) {
      const r = (await run<KeySqlRow>(c, "lockKey", [id])).rows[0];
      return r === undefined ? undefined : toKeyRow(r);
    },
    async lockHold(id) {
      const r = (await run<HoldColumns>(c, "lockHold", [id])).rows[0];
      return r === undefined ? undefined : holdRowOf(r);
    },
    async lockLease(id) {
      const r = (await run<LeaseColumns<boolean>>(c, "lockLease", [id])).rows[0];
      return r === undefined ? undefined : leaseRowOf(r, asBoolean);
    },
    insertHold(h) {
      write("insertHold", [h.id, h.keyId, h.tokens, h.createdAt, h.expiresAt, h.instanceId]);
    },
    closeHold(id, state, used, charged, closedAt) {
      write("closeHold", [id, state, used, charged, closedAt]);
    },
    insertLease(l, u) {
      write("insertLease", [l.id, l.keyId, l.instanceId, l.createdAt, ...leaseUpdateValues(u, asBoolean)]);
    },
    updateLease(id, u) {
      write("updateLease", [id, ...leaseUpdateValues(u, asBoolean)]);
    },
    setKeyNumbers(id, spent, held, leased) {
      write("setKeyNumbers", [id, spent, held, leased]);
    },
    addDaily(keyId, day, charged, settled, reclaimed) {
      write("addDaily", [keyId, day, charged, settled, reclaimed]);
    },
    async flagDrain(keyId, others) {
      const r =
        others === undefined
          ? await run(c, "drainAll", [keyId])
          : await run(c, "drainOthers", [keyId, others.instanceId, others.now]);
      return r.rowCount ?? 0;
    },
    blockLeases(keyId, until) {
      write("blockLeases", [keyId, until]);
    },
    async revoke(keyId, now) {
      return ((await run(c, "revoke", [keyId, now])).rowCount ?? 0) === 1;
    },
  };
}

/**
 * Runs fn between `begin` and COMMIT on one connection of the pool. The connection pipelines: BEGIN
 * goes out with fn's first read, and fn's writes (collected in `sent`) with the COMMIT, so a
 * transaction that reads the key row and writes costs two round trips. Rolls back and rethrows
 * when fn (or a write) fails; a connection that broke meanwhile is dropped from the pool.
 */
async function inTransaction<T>(
  pool: pg.Pool,
  begin: string,
  fn: (c: pg.PoolClient, sent: Promise<unknown>[]) => Promise<T>,
): Promise<T> {
  let broken: Error | undefined;
  const client = await pool.connect();
  // A checked-out connection's errors are its queries' (they reject); this listener keeps one
  // that ends while the transaction runs (the server gone) from being an uncaught 'error'.
  const onError = (err: Error): void => {
    broken ??= err;
  };
  client.on("error", onError);
  const begun = client.query(begin);
  begun.catch(() => undefined);
  const sent: Promise<unknown>[] = [begun];
  try {
    const result = await fn(client, sent);
    const commit = client.query("COMMIT");
    commit.catch(() => undefined);
    sent.push(commit);
    await Promise.all(sent);
    return result;
  } catch (err) {
    await Promise.allSettled(sent);
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      broken = rollbackError as Error; // the connection is unusable: the pool drops it
    }
    throw err;
  } finally {
    client.release(broken);
    client.off("error", onError);
  }
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
  return {
    key: toKeyRow(key),
    openHolds: counts?.holds ?? 0,
    leases: counts?.leases ?? 0,
    settledHolds: counts?.settled ?? 0,
    reclaimedHolds: counts?.reclaimed ?? 0,
    daily: daily.map(dailyOf),
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
      await pool.query(
        `INSERT INTO keys (id, key_hash, hint, name, budget_tokens, spent_tokens, models, created_at, revoked_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
        keyInsertValues(record),
      );
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
 * `options=-c search_path=…`) of its own: the tables are `keys`, `holds`, `leases`, `usage_daily`
 * and `budget_schema_migrations`.
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

async function migrate(pool: pg.Pool): Promise<void> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query("BEGIN");
    await client.query("SELECT pg_advisory_xact_lock($1)", [MIGRATION_LOCK]);
    await client.query(
      "CREATE TABLE IF NOT EXISTS budget_schema_migrations (version integer PRIMARY KEY, applied_at bigint NOT NULL)",
    );
    const { rows } = await client.query<{ v: number }>(
      "SELECT coalesce(max(version), 0)::bigint AS v FROM budget_schema_migrations",
    );
    const version = rows[0]?.v ?? 0;
    if (version > POSTGRES_BUDGET_SCHEMA_VERSION) {
      throw schemaTooNewError(version, POSTGRES_BUDGET_SCHEMA_VERSION);
    }
    for (let v = version; v < POSTGRES_BUDGET_SCHEMA_VERSION; v++) {
      await client.query(MIGRATIONS[v] ?? "");
      await client.query("INSERT INTO budget_schema_migrations (version, applied_at) VALUES ($1, $2)", [
        v + 1,
        Date.now(),
      ]);
    }
    await client.query("COMMIT");
  } catch (err) {
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      broken = rollbackError as Error;
    }
    throw err;
  } finally {
    client.release(broken);
  }
}

function toKeyRow(row: KeySqlRow): KeyRow {
  return keyRowOf(row, row.models);
}
