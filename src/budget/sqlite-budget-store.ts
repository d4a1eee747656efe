import Database from "better-sqlite3";
import type { BudgetStore, KeyRecord } from "./budget-store.js";
import { groupCommit, untilNotBusy } from "./sqlite-group-commit.js";
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
  type LeaseUpdateValues,
  leaseRowOf,
  leaseUpdateValues,
  type StoreBackend,
  schemaTooNewError,
  type TxRows,
} from "./store-core.js";
import { startWalCheckpointer, type WalCheckpointer } from "./wal-checkpointer.js";

/** WAL pages after which SQLite's own checkpoint runs when the checkpointer worker runs too. */
const WAL_SAFETY_NET_PAGES = 8192;

/** Options of {@link createSqliteBudgetStore}. */
export interface SqliteBudgetStoreOptions {
  /** Path of the SQLite file; created with its schema when missing. */
  readonly path: string;
  /**
   * How long a transaction waits for another process's write lock before failing with
   * SQLITE_BUSY, in milliseconds.
   * @default 5000
   */
  readonly busyTimeoutMs?: number;
  /**
   * SQLite `synchronous` (the journal is WAL either way). `normal`: a commit survives a crash of
   * the process (SIGKILL) but the last commits before a power loss or OS crash may be undone —
   * which only ever forgets charges (or Holds, and their tokens come back), never charges twice.
   * `full`: one fsync per commit, so a commit also survives power loss; several times slower.
   * @default "normal"
   */
  readonly synchronous?: "full" | "normal";
  /**
   * Who runs the WAL checkpoints (copying committed pages from the WAL into the database file,
   * with an fsync of each). `worker`: a worker thread of this store, every 100 ms, so that no
   * transaction on the request path stalls for one (src/budget/wal-checkpointer.ts; should it
   * fail, SQLite's automatic checkpoint takes over). `automatic`: SQLite's own, in whichever
   * transaction's commit passes 1,000 pages of WAL.
   * @default "worker"
   */
  readonly walCheckpoint?: "worker" | "automatic";
  /**
   * How the write transactions (placeHold, settle, renew, reclaim, lease steps) reach the file.
   * `group`: those asked for in the same event-loop turn share one `BEGIN IMMEDIATE … COMMIT`,
   * each in a SAVEPOINT of its own (one that throws is rolled back alone); each resolves only once
   * that COMMIT has returned, so what a caller is told is as durable as with `each`, and one
   * write of the WAL serves them all. `each`: one `BEGIN IMMEDIATE … COMMIT` per transaction.
   * @default "group"
   */
  readonly commit?: "group" | "each";
}

const MIGRATIONS: readonly string[] = [
  // 0 → 1
  `
  CREATE TABLE keys (
    id            TEXT PRIMARY KEY,
    key_hash      BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    hint          TEXT NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    budget_tokens INTEGER NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0 AND spent_tokens <= budget_tokens),
    models        TEXT CHECK (models IS NULL OR json_valid(models)),
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER
  ) STRICT;
  CREATE TABLE holds (
    id             TEXT PRIMARY KEY,
    key_id         TEXT NOT NULL REFERENCES keys(id),
    tokens         INTEGER NOT NULL CHECK (tokens > 0),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    instance_id    TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'settled', 'reclaimed')),
    used_tokens    INTEGER CHECK (used_tokens IS NULL OR used_tokens >= 0),
    charged_tokens INTEGER NOT NULL DEFAULT 0 CHECK (charged_tokens >= 0 AND charged_tokens <= tokens),
    closed_at      INTEGER
  ) STRICT;
  CREATE INDEX holds_open_by_key ON holds (key_id) WHERE state = 'open';
  CREATE INDEX holds_open_by_expiry ON holds (expires_at) WHERE state = 'open';
  CREATE INDEX holds_open_by_instance ON holds (instance_id) WHERE state = 'open';
  `,
  // 1 → 2: held and leased tokens on the key row (spent + held + leased ≤ budget is a CHECK),
  // leases, usage per key and day (closed Holds are purged after a retention time).
  `
  CREATE TABLE keys_v2 (
    id                TEXT PRIMARY KEY,
    key_hash          BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    hint              TEXT NOT NULL,
    name              TEXT NOT NULL DEFAULT '',
    budget_tokens     INTEGER NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens      INTEGER NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0),
    held_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    leased_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    lease_block_until INTEGER NOT NULL DEFAULT 0,
    models            TEXT CHECK (models IS NULL OR json_valid(models)),
    created_at        INTEGER NOT NULL,
    revoked_at        INTEGER,
    CHECK (spent_tokens + held_tokens + leased_tokens <= budget_tokens)
  ) STRICT;
  INSERT INTO keys_v2 (id, key_hash, hint, name, budget_tokens, spent_tokens, held_tokens, models, created_at, revoked_at)
    SELECT k.id, k.key_hash, k.hint, k.name, k.budget_tokens, k.spent_tokens,
           coalesce((SELECT sum(h.tokens) FROM holds h WHERE h.key_id = k.id AND h.state = 'open'), 0),
           k.models, k.created_at, k.revoked_at
    FROM keys k;
  DROP TABLE keys;
  ALTER TABLE keys_v2 RENAME TO keys;
  CREATE TABLE leases (
    id             TEXT PRIMARY KEY,
    key_id         TEXT NOT NULL REFERENCES keys(id),
    instance_id    TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'reclaimed')),
    tokens         INTEGER NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    reclaim_charge INTEGER NOT NULL DEFAULT 0 CHECK (reclaim_charge >= 0 AND reclaim_charge <= tokens),
    holds          INTEGER NOT NULL DEFAULT 0 CHECK (holds >= 0),
    seq            INTEGER NOT NULL DEFAULT 0,
    last_result    INTEGER NOT NULL DEFAULT 0,
    drain          INTEGER NOT NULL DEFAULT 0 CHECK (drain IN (0, 1)),
    closing        INTEGER NOT NULL DEFAULT 0 CHECK (closing IN (0, 1)),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    closed_at      INTEGER
  ) STRICT;
  CREATE INDEX leases_open_by_key ON leases (key_id) WHERE state = 'open';
  CREATE INDEX leases_open_by_expiry ON leases (expires_at) WHERE state = 'open';
  CREATE INDEX leases_open_by_instance ON leases (instance_id) WHERE state = 'open';
  CREATE INDEX leases_closed ON leases (closed_at) WHERE state != 'open';
  CREATE INDEX holds_closed ON holds (closed_at) WHERE state != 'open';
  CREATE TABLE usage_daily (
    key_id          TEXT NOT NULL REFERENCES keys(id),
    day             TEXT NOT NULL,
    charged_tokens  INTEGER NOT NULL DEFAULT 0,
    settled_holds   INTEGER NOT NULL DEFAULT 0,
    reclaimed_holds INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, day)
  ) STRICT, WITHOUT ROWID;
  INSERT INTO usage_daily (key_id, day, charged_tokens, settled_holds, reclaimed_holds)
    SELECT key_id, strftime('%Y-%m-%d', coalesce(closed_at, created_at) / 1000, 'unixepoch'),
           sum(charged_tokens), sum(state = 'settled'), sum(state = 'reclaimed')
    FROM holds WHERE state != 'open' GROUP BY 1, 2;
  `,
];

/** The schema version this code writes (`PRAGMA user_version`): one per migration. */
export const BUDGET_SCHEMA_VERSION: number = MIGRATIONS.length;

/** A `keys` row: `models` is JSON text. */
type KeySqlRow = KeyColumns<string | null>;

/** A boolean column as SQLite stores it (0 or 1: a CHECK keeps it so), read. */
function fromBit(value: number): boolean {
  return value === 1;
}

/** A boolean as SQLite stores it: 1 or 0. */
function toBit(value: boolean): number {
  return value ? 1 : 0;
}

/**
 * Opens (or creates) the SQLite file in WAL mode and migrates it; closes it again and throws when
 * that fails (a schema newer than this code among others).
 */
function openDatabase(options: SqliteBudgetStoreOptions, busyTimeoutMs: number): Database.Database {
  const db = new Database(options.path);
  try {
    db.pragma(`busy_timeout = ${busyTimeoutMs}`);
    db.pragma("journal_mode = WAL");
    db.pragma(`synchronous = ${options.synchronous === "full" ? "FULL" : "NORMAL"}`);
    migrate(db);
    db.pragma("foreign_keys = ON");
  } catch (err) {
    db.close();
    throw err;
  }
  return db;
}

/**
 * The checkpointer worker of the store's file (options.walCheckpoint `worker`), with SQLite's own
 * checkpoint further apart; undefined with `automatic`.
 */
function startCheckpointer(
  db: Database.Database,
  options: SqliteBudgetStoreOptions,
): WalCheckpointer | undefined {
  if ((options.walCheckpoint ?? "worker") !== "worker") return undefined;
  // SQLite's own checkpoint stays on as a safety net, 8× further apart than its default: under
  // writes without a pause a checkpoint on another connection never catches up with the WAL's
  // end, and only a checkpoint in a writer's commit lets the WAL start over (it would grow
  // without bound otherwise). It then finds the pages copied and has little left to do.
  db.pragma(`wal_autocheckpoint = ${WAL_SAFETY_NET_PAGES}`);
  return startWalCheckpointer(options.path, {
    onFailure: (error) => {
      if (db.open) db.pragma("wal_autocheckpoint = 1000"); // SQLite's default
      process.emitWarning(`${error.message}; SQLite's automatic checkpoint takes over`);
    },
  });
}

/**
 * The statements on keys, usage and lease flags (see {@link prepareHoldStatements} for Holds and
 * leases), prepared once on the migrated database.
 */
function prepareKeyStatements(db: Database.Database) {
  return {
    insertKey: db.prepare<ReturnType<typeof keyInsertValues>>(
      `INSERT INTO keys (id, key_hash, hint, name, budget_tokens, spent_tokens, models, created_at, revoked_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
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
    drainOthers: db.prepare<[string, string, number]>(
      `UPDATE leases SET drain = 1
       WHERE key_id = ? AND state = 'open' AND instance_id != ? AND expires_at > ? AND tokens > 0 AND closing = 0`,
    ),
    blockLeases: db.prepare<[number, string]>(
      "UPDATE keys SET lease_block_until = max(lease_block_until, ?) WHERE id = ?",
    ),
    setKeyNumbers: db.prepare<[number, number, number, string]>(
      "UPDATE keys SET spent_tokens = ?, held_tokens = ?, leased_tokens = ? WHERE id = ?",
    ),
    reserve: db.prepare<[number, string, number]>(
      `UPDATE keys SET held_tokens = held_tokens + ?
       WHERE id = ? AND revoked_at IS NULL AND budget_tokens - spent_tokens - held_tokens - leased_tokens >= ?`,
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

/** The statements on Hold and lease rows, prepared once on the migrated database. */
function prepareHoldStatements(db: Database.Database) {
  return {
    insertHold: db.prepare<[string, string, number, number, number, string]>(
      "INSERT INTO holds (id, key_id, tokens, created_at, expires_at, instance_id) VALUES (?, ?, ?, ?, ?, ?)",
    ),
    renew: db.prepare<[number, number, string]>(
      `UPDATE holds SET expires_at = ?, used_tokens = max(coalesce(used_tokens, 0), ?)
       WHERE id = ? AND state = 'open'`,
    ),
    holdById: db.prepare<[string], HoldColumns>(
      "SELECT id, key_id, tokens, state, used_tokens, charged_tokens, expires_at FROM holds WHERE id = ?",
    ),
    holdKey: db.prepare<[string], { key_id: string }>("SELECT key_id FROM holds WHERE id = ?"),
    settleOpen: db.prepare<
      [number, number, number, string],
      { key_id: string; tokens: number; charged_tokens: number }
    >(
      `UPDATE holds SET state = 'settled', used_tokens = ?, charged_tokens = min(?, tokens), closed_at = ?
       WHERE id = ? AND state = 'open' RETURNING key_id, tokens, charged_tokens`,
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
      `SELECT id, key_id, state, tokens, reclaim_charge, holds, seq, last_result, drain, closing, expires_at
       FROM leases WHERE id = ?`,
    ),
    insertLease: db.prepare<[string, string, string, number, number]>(
      "INSERT INTO leases (id, key_id, instance_id, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
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
type Statements = ReturnType<typeof prepareKeyStatements> & ReturnType<typeof prepareHoldStatements>;

/**
 * Row access inside a transaction. Every "lock" is a plain read: the transaction's BEGIN IMMEDIATE
 * holds the database's write lock already (hence also the shortcuts).
 */
function rowsOf(stmt: Statements): TxRows {
  const rows: TxRows = {
    async lockKey(id) {
      const row = stmt.keyById.get(id);
      return row === undefined ? undefined : toKeyRow(row);
    },
    async lockHold(id) {
      const r = stmt.holdById.get(id);
      return r === undefined ? undefined : holdRowOf(r);
    },
    async lockLease(id) {
      const r = stmt.leaseById.get(id);
      return r === undefined ? undefined : leaseRowOf(r, fromBit);
    },
    insertHold(h) {
      stmt.insertHold.run(h.id, h.keyId, h.tokens, h.createdAt, h.expiresAt, h.instanceId);
    },
    closeHold(id, state, used, charged, closedAt) {
      stmt.closeHold.run(state, used, charged, closedAt, id);
    },
    insertLease(l, columns) {
      stmt.insertLease.run(l.id, l.keyId, l.instanceId, l.createdAt, columns.expiresAt);
      rows.updateLease(l.id, columns);
    },
    updateLease(id, u) {
      stmt.updateLease.run(...leaseUpdateValues(u, toBit), id);
    },
    setKeyNumbers(id, spent, held, leased) {
      stmt.setKeyNumbers.run(spent, held, leased, id);
    },
    addDaily(keyId, day, charged, settled, reclaimed) {
      stmt.addDaily.run(keyId, day, charged, settled, reclaimed);
    },
    async flagDrain(keyId, others) {
      return others === undefined
        ? stmt.drainAll.run(keyId).changes
        : stmt.drainOthers.run(keyId, others.instanceId, others.now).changes;
    },
    blockLeases(keyId, until) {
      stmt.blockLeases.run(until, keyId);
    },
    async revoke(keyId, now) {
      return stmt.revoke.run(now, keyId).changes === 1;
    },
    // BEGIN IMMEDIATE holds the database's write lock from the start: no row needs locking first.
    shortcuts: {
      reserve: (keyId, tokens) => stmt.reserve.run(tokens, keyId, tokens).changes === 1,
      settleOpen(holdId, usedTokens, closedAt) {
        const r = stmt.settleOpen.get(usedTokens, usedTokens, closedAt, holdId);
        return r === undefined ? undefined : { keyId: r.key_id, tokens: r.tokens, charged: r.charged_tokens };
      },
      moveHeld(keyId, charged, released) {
        stmt.moveHeld.run(charged, released, keyId);
      },
    },
  };
  return rows;
}

/** How a store's statements and transactions take turns on its one connection. */
interface SqliteConnection {
  /** Runs fn once every step asked for before it has ended: one statement or transaction at a time. */
  serial<T>(fn: () => T | Promise<T>): Promise<T>;
  /** Runs fn between BEGIN (deferred: a read snapshot) and COMMIT, as one serial step; rolls back if it throws. */
  readTransaction<T>(fn: () => Promise<T>): Promise<T>;
  /** Runs fn between BEGIN IMMEDIATE and COMMIT, as one serial step; rolls back if it throws. */
  immediateTransaction<T>(fn: () => Promise<T>): Promise<T>;
  /** A write transaction: grouped with the others of its event-loop turn (`group`) or on its own (`each`). */
  writeTransaction<T>(fn: () => Promise<T>): Promise<T>;
  /** Starts the grouped transactions asked for so far (group commit); nothing with `each`. */
  flush(): void;
}

/**
 * The connection discipline of a store on `db`: a queue of steps, and (with `grouped`) group
 * commit with busy_timeout = 0, a busy step being tried again on later turns for up to
 * `busyTimeoutMs`.
 */
function serialConnection(db: Database.Database, grouped: boolean, busyTimeoutMs: number): SqliteConnection {
  // One statement or transaction at a time on this connection: a transaction's steps are awaited,
  // so another caller's statement would otherwise run inside it.
  let queue: Promise<unknown> = Promise.resolve();
  function rawSerial<T>(fn: () => T | Promise<T>): Promise<T> {
    const result = queue.then(fn, fn);
    queue = result.catch(() => undefined);
    return result;
  }
  // With group commit the connection has busy_timeout = 0 (below): a step that finds another
  // process writing is tried again on a later turn instead of sleeping in SQLite's busy handler
  // (every step here is one statement, reads, or a transaction that starts with its BEGIN).
  const serial: <T>(fn: () => T | Promise<T>) => Promise<T> = grouped
    ? (fn) => rawSerial(() => untilNotBusy(fn, busyTimeoutMs))
    : rawSerial;
  // Prepared once: `db.exec` would parse the SQL again for every transaction (issue 13).
  const beginImmediate = db.prepare("BEGIN IMMEDIATE");
  const beginDeferred = db.prepare("BEGIN");
  const commit = db.prepare("COMMIT");
  const rollback = db.prepare("ROLLBACK");
  function inTransaction<T>(begin: Database.Statement, fn: () => Promise<T>): Promise<T> {
    return serial(async () => {
      begin.run();
      try {
        const result = await fn();
        commit.run();
        return result;
      } catch (err) {
        if (db.inTransaction) rollback.run();
        throw err;
      }
    });
  }

  // Group commit (src/budget/sqlite-group-commit.ts): the transactions of one event-loop turn share
  // one COMMIT, each in its own SAVEPOINT; `each`: one COMMIT per transaction.
  // The group's BEGIN waits for the lock the same way (groupCommit); the group itself is one step.
  const group = grouped ? groupCommit(db, rawSerial, { busyTimeoutMs }) : undefined;
  if (grouped) db.pragma("busy_timeout = 0");
  const writeTransaction: <T>(fn: () => Promise<T>) => Promise<T> =
    group === undefined ? (fn) => inTransaction(beginImmediate, fn) : group.transaction;
  return {
    serial,
    readTransaction: (fn) => inTransaction(beginDeferred, fn),
    immediateTransaction: (fn) => inTransaction(beginImmediate, fn),
    writeTransaction,
    flush: () => group?.flush(),
  };
}

/** {@link StoreBackend.keyUsage}'s reads, inside one read transaction (a snapshot). */
function readKeyUsage(
  stmt: Statements,
  keyId: string,
  days: number,
): Awaited<ReturnType<StoreBackend["keyUsage"]>> {
  const key = stmt.keyById.get(keyId);
  if (key === undefined) return undefined;
  const open = stmt.openCounts.get(keyId, keyId) ?? { holds: 0, leases: 0 };
  const totals = stmt.totals.get(keyId) ?? { settled: 0, reclaimed: 0 };
  return {
    key: toKeyRow(key),
    openHolds: open.holds,
    leases: open.leases,
    settledHolds: totals.settled,
    reclaimedHolds: totals.reclaimed,
    daily: stmt.daily.all(keyId, days).map(dailyOf),
  };
}

/**
 * The StoreBackend of a migrated database: its statements, run in turn on the connection, and its
 * transactions (all of them with the rows of {@link rowsOf}); closing it stops the checkpointer.
 */
function sqliteBackend(
  db: Database.Database,
  stmt: Statements,
  conn: SqliteConnection,
  checkpointer: WalCheckpointer | undefined,
): StoreBackend {
  const rows = rowsOf(stmt);
  return {
    kind: "sqlite",
    shortcuts: true,
    transaction: (fn) => conn.writeTransaction(() => fn(rows)),
    insertKey: (record: KeyRecord) =>
      conn.serial(() => {
        stmt.insertKey.run(...keyInsertValues(record));
      }),
    findKeyByHash: (keyHash) =>
      conn.serial(() => {
        const row = stmt.keyByHash.get(Buffer.from(keyHash));
        return row === undefined ? undefined : toKeyRow(row);
      }),
    listKeys: () => conn.serial(() => stmt.listKeys.all().map(toKeyRow)),
    keyUsage: (keyId, days) => conn.readTransaction(async () => readKeyUsage(stmt, keyId, days)),
    addBudget: (keyId, tokens) => conn.serial(() => stmt.addBudget.run(tokens, keyId).changes === 1),
    renewHold: (holdId, expiresAt, usedTokens) =>
      conn.serial(() => stmt.renew.run(expiresAt, usedTokens, holdId).changes === 1),
    holdKeyId: (holdId) => conn.serial(() => stmt.holdKey.get(holdId)?.key_id),
    openItems: (filter) =>
      conn.serial(() => {
        if ("expiredAt" in filter) {
          return {
            holds: stmt.expiredHolds.all(filter.expiredAt),
            leases: stmt.expiredLeases.all(filter.expiredAt),
          };
        }
        const id = filter.instanceId ?? null;
        return { holds: stmt.openHolds.all(id, id), leases: stmt.openLeases.all(id, id) };
      }),
    drainRequests: (instanceId) => conn.serial(() => stmt.drainRequests.all(instanceId).map((r) => r.id)),
    drainsPending: (keyId, now, exceptInstanceId) =>
      conn.serial(() => stmt.drainsPending.get(keyId, now, exceptInstanceId)?.n ?? 0),
    purgeClosed: (before) =>
      conn.immediateTransaction(
        async () => stmt.purgeHolds.run(before).changes + stmt.purgeLeases.run(before).changes,
      ),
    probeWrite: () =>
      conn.writeTransaction(async () => {
        stmt.probe.run();
      }),
    close: () => {
      conn.flush(); // the transactions asked for before the close run before it
      return conn.serial(async () => {
        await checkpointer?.close();
        if (db.open) db.close();
      });
    },
  };
}

/**
 * The embedded store: one SQLite file in WAL mode, shared safely by every thread and process that
 * opens it (each write is a `BEGIN IMMEDIATE` transaction, so a read-then-write never races).
 * Opens (or creates) the file and brings its schema to {@link BUDGET_SCHEMA_VERSION}; throws when
 * the file has a newer schema than this code knows. better-sqlite3 is synchronous; this store's
 * transactions run one at a time per store (a queue), each without yielding to other I/O.
 */
export function createSqliteBudgetStore(options: SqliteBudgetStoreOptions): BudgetStore {
  const busyTimeoutMs = Math.max(0, Math.floor(options.busyTimeoutMs ?? 5000));
  const db = openDatabase(options, busyTimeoutMs);
  const checkpointer = startCheckpointer(db, options);
  // Prepared before the connection's discipline sets busy_timeout = 0 (group commit).
  const stmt: Statements = { ...prepareKeyStatements(db), ...prepareHoldStatements(db) };
  const conn = serialConnection(db, (options.commit ?? "group") === "group", busyTimeoutMs);
  return createBudgetStoreOn(sqliteBackend(db, stmt, conn, checkpointer));
}

function migrate(db: Database.Database): void {
  // Rebuilding a table (1 → 2) needs foreign keys off, which cannot change inside a transaction.
  db.pragma("foreign_keys = OFF");
  db.transaction(() => {
    const version = db.pragma("user_version", { simple: true }) as number;
    if (version > BUDGET_SCHEMA_VERSION) {
      throw schemaTooNewError(version, BUDGET_SCHEMA_VERSION);
    }
    for (let v = version; v < BUDGET_SCHEMA_VERSION; v++) db.exec(MIGRATIONS[v] ?? "");
    if (version !== BUDGET_SCHEMA_VERSION) {
      const broken = db.pragma("foreign_key_check") as unknown[];
      if (broken.length > 0) throw new Error(`Budget database migration broke ${broken.length} foreign keys`);
      db.pragma(`user_version = ${BUDGET_SCHEMA_VERSION}`);
    }
  }).immediate();
}

function toKeyRow(row: KeySqlRow): KeyRow {
  return keyRowOf(row, row.models === null ? null : (JSON.parse(row.models) as string[]));
}
