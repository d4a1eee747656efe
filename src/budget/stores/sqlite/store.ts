// The embedded store: one SQLite file in WAL mode (better-sqlite3), the shared transactions of
// ../store-on.ts over its rows (./rows.ts), run in turn on its one connection (./connection.ts).
import Database from "better-sqlite3";
import type { BudgetStore, KeyRecord } from "../../budget-store.js";
import { startWalCheckpointer, type WalCheckpointer } from "../../wal-checkpointer.js";
import { adminKeyOf, auditOf, pageOf } from "../admin-rows.js";
import type { StoreBackend } from "../backend.js";
import { dailyOf, keyInsertValues, periodOf } from "../rows.js";
import { createBudgetStoreOn } from "../store-on.js";
import { prepareAdminStatements } from "./admin-statements.js";
import { type SqliteConnection, serialConnection } from "./connection.js";
import { rowsOf } from "./rows.js";
import { migrate } from "./schema.js";
import {
  prepareHoldStatements,
  prepareKeyStatements,
  preparePeriodStatements,
  type Statements,
  toKeyRow,
} from "./statements.js";

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

/** Most distinct statements of the shared SQL kept prepared (a flush's INSERT varies with its row count). */
const MAX_CACHED_STATEMENTS = 64;

/** Prepares `sql` once: the shared SQL's statements, cached by their text (emptied when full). */
function cachedStatements(db: Database.Database): (sql: string) => Database.Statement {
  const cache = new Map<string, Database.Statement>();
  return (sql) => {
    let stmt = cache.get(sql);
    if (stmt === undefined) {
      if (cache.size >= MAX_CACHED_STATEMENTS) cache.clear();
      stmt = db.prepare(sql);
      cache.set(sql, stmt);
    }
    return stmt;
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
    periods: stmt.periods.all(keyId, days).map(periodOf),
  };
}

/** The admin surface's reads (see {@link StoreBackend}), each one serial step. */
function adminReads(
  stmt: Statements,
  conn: SqliteConnection,
): Pick<StoreBackend, "getKey" | "listKeysPage" | "findAdminKeyByHash" | "listAuditPage"> {
  return {
    getKey: (keyId) =>
      conn.serial(() => {
        const row = stmt.keyById.get(keyId);
        return row === undefined ? undefined : toKeyRow(row);
      }),
    listKeysPage: ({ after, limit }) =>
      conn.serial(() => {
        if (after !== undefined && stmt.keyById.get(after) === undefined) return undefined;
        const rows =
          after === undefined ? stmt.keysFirst.all(limit + 1) : stmt.keysAfter.all(after, limit + 1);
        return pageOf(rows.map(toKeyRow), limit);
      }),
    findAdminKeyByHash: (keyHash) =>
      conn.serial(() => {
        const row = stmt.adminKeyByHash.get(Buffer.from(keyHash));
        return row === undefined ? undefined : adminKeyOf(row);
      }),
    listAuditPage: ({ after, limit }) =>
      conn.serial(() => {
        if (after !== undefined && (stmt.auditExists.get(after)?.n ?? 0) === 0) return undefined;
        const rows =
          after === undefined ? stmt.auditFirst.all(limit + 1) : stmt.auditAfter.all(after, limit + 1);
        return pageOf(
          rows.map((r) => auditOf(r, (text) => JSON.parse(text))),
          limit,
        );
      }),
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
  const prepared = cachedStatements(db);
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
    ...adminReads(stmt, conn),
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
    placeholder: () => "?",
    write: (sql, values) =>
      conn.writeTransaction(async () => {
        prepared(sql).run(...values);
      }),
    read: <T>(sql: string, values: readonly unknown[]) =>
      conn.serial(() => prepared(sql).all(...values) as T[]),
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
  const stmt: Statements = {
    ...prepareKeyStatements(db),
    ...preparePeriodStatements(db),
    ...prepareHoldStatements(db),
    ...prepareAdminStatements(db),
  };
  const conn = serialConnection(db, (options.commit ?? "group") === "group", busyTimeoutMs);
  return createBudgetStoreOn(sqliteBackend(db, stmt, conn, checkpointer));
}
