// How the SQLite store's statements and transactions take turns on its one connection: a queue of
// steps, and (with group commit, ./group-commit.ts) busy_timeout = 0 with busy steps tried again.
import type Database from "better-sqlite3";
import { type GroupCommit, groupCommit, untilNotBusy } from "./group-commit.js";

/** How a store's statements and transactions take turns on its one connection. */
export interface SqliteConnection {
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

/** The state of one store's connection: its statements of transaction control and its queue. */
interface Connection {
  readonly db: Database.Database;
  readonly grouped: boolean;
  readonly busyTimeoutMs: number;
  // Prepared once: `db.exec` would parse the SQL again for every transaction (issue 13).
  readonly beginImmediate: Database.Statement;
  readonly beginDeferred: Database.Statement;
  readonly commit: Database.Statement;
  readonly rollback: Database.Statement;
  /** The last step asked for: the next one runs once it has ended. */
  queue: Promise<unknown>;
  /** Group commit (`grouped`), else undefined: one COMMIT per transaction. */
  group: GroupCommit | undefined;
}

/**
 * One statement or transaction at a time on this connection: a transaction's steps are awaited,
 * so another caller's statement would otherwise run inside it.
 */
function rawSerial<T>(c: Connection, fn: () => T | Promise<T>): Promise<T> {
  const result = c.queue.then(fn, fn);
  c.queue = result.catch(() => undefined);
  return result;
}

/**
 * {@link SqliteConnection.serial}. With group commit the connection has busy_timeout = 0: a step
 * that finds another process writing is tried again on a later turn instead of sleeping in
 * SQLite's busy handler (every step here is one statement, reads, or a transaction that starts
 * with its BEGIN).
 */
function serial<T>(c: Connection, fn: () => T | Promise<T>): Promise<T> {
  return c.grouped ? rawSerial(c, () => untilNotBusy(fn, c.busyTimeoutMs)) : rawSerial(c, fn);
}

/** Runs fn between `begin` and COMMIT as one serial step; rolls back if it throws. */
function inTransaction<T>(c: Connection, begin: Database.Statement, fn: () => Promise<T>): Promise<T> {
  return serial(c, async () => {
    begin.run();
    try {
      const result = await fn();
      c.commit.run();
      return result;
    } catch (err) {
      if (c.db.inTransaction) c.rollback.run();
      throw err;
    }
  });
}

/**
 * The connection discipline of a store on `db`: a queue of steps, and (with `grouped`) group
 * commit with busy_timeout = 0, a busy step being tried again on later turns for up to
 * `busyTimeoutMs`.
 */
export function serialConnection(
  db: Database.Database,
  grouped: boolean,
  busyTimeoutMs: number,
): SqliteConnection {
  const c: Connection = {
    db,
    grouped,
    busyTimeoutMs,
    beginImmediate: db.prepare("BEGIN IMMEDIATE"),
    beginDeferred: db.prepare("BEGIN"),
    commit: db.prepare("COMMIT"),
    rollback: db.prepare("ROLLBACK"),
    queue: Promise.resolve(),
    group: undefined,
  };
  // Group commit (./group-commit.ts): the transactions of one event-loop turn share one COMMIT,
  // each in its own SAVEPOINT; `each`: one COMMIT per transaction. The group's BEGIN waits for
  // the lock the same way (groupCommit); the group itself is one step.
  if (grouped) {
    c.group = groupCommit(db, (step) => rawSerial(c, step), { busyTimeoutMs });
    db.pragma("busy_timeout = 0");
  }
  return {
    serial: (fn) => serial(c, fn),
    readTransaction: (fn) => inTransaction(c, c.beginDeferred, fn),
    immediateTransaction: (fn) => inTransaction(c, c.beginImmediate, fn),
    writeTransaction: (fn) =>
      c.group === undefined ? inTransaction(c, c.beginImmediate, fn) : c.group.transaction(fn),
    flush: () => c.group?.flush(),
  };
}
