// How the SQLite store's statements and transactions take turns on its one connection: a queue of
// steps, and (with group commit, ./group-commit.ts) busy_timeout = 0 with busy steps tried again.
import type Database from "better-sqlite3";
import { groupCommit, untilNotBusy } from "./group-commit.js";

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
