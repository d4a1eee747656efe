// Group commit for the SQLite store (issue 13): the write transactions asked for in one event-loop
// turn share one `BEGIN IMMEDIATE … COMMIT`.
import type Database from "better-sqlite3";

/** True for SQLITE_BUSY and its extended codes (the lock is another connection's; try later). */
export const isBusy = (err: unknown): boolean =>
  typeof (err as { code?: unknown } | null)?.code === "string" &&
  ((err as { code: string }).code === "SQLITE_BUSY" ||
    (err as { code: string }).code.startsWith("SQLITE_BUSY_"));

/**
 * Runs `step` (statements on a connection with `busy_timeout = 0`) and, while it throws SQLITE_BUSY,
 * runs it again on a later turn — the next 8 turns, then every millisecond — until `timeoutMs` has
 * passed, then throws that SQLITE_BUSY. The event loop goes on meanwhile, where SQLite's busy
 * handler would sleep in the thread. Only for a step that a SQLITE_BUSY leaves without effect:
 * one statement, or a transaction whose BEGIN IMMEDIATE is its first statement.
 */
export async function untilNotBusy<T>(step: () => T | Promise<T>, timeoutMs: number): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (let attempt = 0; ; attempt++) {
    try {
      return await step();
    } catch (err) {
      if (!isBusy(err) || performance.now() >= deadline) throw err;
    }
    await new Promise<void>((r) => (attempt < 8 ? setImmediate(r) : setTimeout(r, 1)));
  }
}

/**
 * Most transactions in one group: a bigger turn is split into groups of this size, so that another
 * process waits for the write lock at most one group's time (~20–25 µs per transaction).
 */
export const MAX_GROUP_TRANSACTIONS = 1000;

type Pending = { fn: () => Promise<unknown>; resolve: (v: unknown) => void; reject: (e: unknown) => void };
/** What {@link groupCommit} returns. */
export interface GroupCommit {
  /** Runs fn in a write transaction of the current turn's group (see {@link groupCommit}). */
  transaction<T>(fn: () => Promise<T>): Promise<T>;
  /**
   * Queues the group being gathered on the connection now, instead of at the turn's end: call it
   * before closing the store, so that the transactions asked for before run before the close.
   */
  flush(): void;
}
type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

/** The state of one connection's group commit: its statements, and the group being gathered. */
interface Grouping {
  readonly db: Database.Database;
  readonly serial: (step: () => Promise<void>) => Promise<void>;
  readonly busyTimeoutMs: number;
  readonly beginImmediate: Database.Statement;
  readonly commit: Database.Statement;
  readonly rollback: Database.Statement;
  readonly savepoint: Database.Statement;
  readonly release: Database.Statement;
  readonly rollbackTo: Database.Statement;
  /** The transactions asked for in this turn, not yet queued on the connection. */
  gathering: Pending[] | undefined;
}

/** BEGIN IMMEDIATE, tried again on later turns while another connection writes (see {@link groupCommit}). */
function begin(g: Grouping): Promise<unknown> {
  return untilNotBusy(() => g.beginImmediate.run(), g.busyTimeoutMs);
}

/** ROLLBACK of what is left open; an error of its own would only hide the one being answered. */
function rollbackQuietly(g: Grouping): void {
  try {
    if (g.db.inTransaction) g.rollback.run();
  } catch {
    // The transaction is gone either way (SQLite rolls back by itself when ROLLBACK cannot run).
  }
}

/** A transaction alone in its turn: its own BEGIN IMMEDIATE … COMMIT, no SAVEPOINT. */
async function runAlone(g: Grouping, p: Pending): Promise<void> {
  try {
    await begin(g);
    const value = await p.fn();
    g.commit.run();
    p.resolve(value);
  } catch (err) {
    rollbackQuietly(g);
    p.reject(err);
  }
}

/** A group: one BEGIN IMMEDIATE … COMMIT, each transaction in a SAVEPOINT; answers each once committed. */
async function runGroup(g: Grouping, group: Pending[]): Promise<void> {
  if (group.length === 1) return runAlone(g, group[0] as Pending);
  const outcomes: Outcome[] = [];
  try {
    await begin(g);
    for (const p of group) {
      g.savepoint.run();
      try {
        outcomes.push({ ok: true, value: await p.fn() });
        g.release.run();
      } catch (error) {
        if (!g.db.inTransaction) throw error; // the whole transaction is gone, the others' writes too
        g.rollbackTo.run();
        g.release.run();
        outcomes.push({ ok: false, error });
      }
    }
    g.commit.run();
  } catch (err) {
    rollbackQuietly(g);
    for (const p of group) p.reject(err);
    return;
  }
  for (const [i, p] of group.entries()) {
    const o = outcomes[i] as Outcome;
    if (o.ok) p.resolve(o.value);
    else p.reject(o.error);
  }
}

/** Queues the group being gathered, if any, on the connection now. */
function flush(g: Grouping): void {
  const group = g.gathering;
  if (group === undefined) return;
  g.gathering = undefined;
  void g.serial(() => runGroup(g, group));
}

/** Adds fn to the turn's group (started at the first, queued at the turn's end or when full). */
function enqueue<T>(g: Grouping, fn: () => Promise<T>): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    if (g.gathering === undefined) {
      g.gathering = [];
      setImmediate(() => flush(g));
    }
    g.gathering.push({ fn, resolve: resolve as (v: unknown) => void, reject });
    if (g.gathering.length >= MAX_GROUP_TRANSACTIONS) flush(g);
  });
}

/**
 * Returns `transaction(fn)`, which runs `fn` (its statements on `db`) in a write transaction, resolving
 * with fn's value once the transaction is committed, or rejecting with what fn threw (its writes
 * rolled back) or with the error of `BEGIN IMMEDIATE`/`COMMIT` (SQLITE_BUSY past the busy timeout,
 * an I/O error: nothing of the group is committed then).
 *
 * The transactions asked for in one event-loop turn — the Holds and settles of the requests whose
 * bytes arrived in it — wait for that turn's end (`setImmediate`), then run in the order asked in
 * **one** `BEGIN IMMEDIATE … COMMIT`, each in a `SAVEPOINT` of its own, so that one that throws is
 * rolled back alone and the others still commit. Each resolves only once that COMMIT has
 * returned: what its caller is told is exactly as durable as with a COMMIT of its own, and the
 * key's page and the Holds' pages reach the WAL once for the group instead of once each. A
 * transaction alone in its turn runs without a SAVEPOINT; a turn of more than
 * {@link MAX_GROUP_TRANSACTIONS} is split into groups of that many. An error that ends the whole
 * transaction (SQLite rolls back by itself on some I/O errors) rejects every transaction of the
 * group with it.
 *
 * `BEGIN IMMEDIATE` does not block the event loop while another process (an `ACS_WORKERS` sibling)
 * holds the file's write lock: the connection is meant to have `busy_timeout = 0` (SQLite's busy
 * handler sleeps in the calling thread), and a group's BEGIN that finds the lock taken is tried
 * again on the next turns ({@link untilNotBusy}) until `busyTimeoutMs` has passed; then the group
 * is rejected with SQLITE_BUSY.
 *
 * @param serial runs one step at a time on the connection (the store's queue): a group is one step.
 * @param options.busyTimeoutMs how long a group waits for the write lock (ms).
 */
export function groupCommit(
  db: Database.Database,
  serial: (step: () => Promise<void>) => Promise<void>,
  options: { busyTimeoutMs: number },
): GroupCommit {
  const g: Grouping = {
    db,
    serial,
    busyTimeoutMs: options.busyTimeoutMs,
    beginImmediate: db.prepare("BEGIN IMMEDIATE"),
    commit: db.prepare("COMMIT"),
    rollback: db.prepare("ROLLBACK"),
    savepoint: db.prepare("SAVEPOINT grouped"),
    release: db.prepare("RELEASE grouped"),
    rollbackTo: db.prepare("ROLLBACK TO grouped"),
    gathering: undefined,
  };
  return {
    transaction: <T>(fn: () => Promise<T>): Promise<T> => enqueue(g, fn),
    flush: () => flush(g),
  };
}
