// Group commit of the SQLite store (src/budget/stores/sqlite/group-commit.ts): the write transactions asked
// for in one event-loop turn run in one BEGIN IMMEDIATE … COMMIT, each in its own SAVEPOINT; each
// resolves only once that COMMIT has returned. Checked on real SQLite files, with a second
// connection as the outside observer of what is committed.
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { groupCommit, MAX_GROUP_TRANSACTIONS } from "../../src/budget/stores/sqlite/group-commit.js";
import { tempDb } from "./helpers.js";

function openPair(path: string, busyTimeoutMs = 5000) {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 0"); // as the store sets it with group commit
  db.exec("CREATE TABLE t (name TEXT PRIMARY KEY)");
  const observer = new Database(path, { readonly: true });
  let queue: Promise<unknown> = Promise.resolve();
  const serial = (step: () => Promise<void>) => {
    const r = queue.then(step, step);
    queue = r.catch(() => undefined);
    return r;
  };
  const { transaction } = groupCommit(db, serial, { busyTimeoutMs });
  const insert = db.prepare<[string]>("INSERT INTO t (name) VALUES (?)");
  const committed = () =>
    observer
      .prepare<[], { name: string }>("SELECT name FROM t ORDER BY name")
      .all()
      .map((r) => r.name);
  return { db, observer, transaction, insert, committed };
}

describe("groupCommit", () => {
  let tmp: ReturnType<typeof tempDb>;
  let pair: ReturnType<typeof openPair> | undefined;
  afterEach(() => {
    pair?.observer.close();
    pair?.db.close();
    pair = undefined;
    tmp.cleanup();
  });

  it("runs the transactions of one turn in one transaction, in order, and resolves them after its COMMIT", async () => {
    tmp = tempDb();
    pair = openPair(tmp.path);
    const { db, transaction, insert, committed } = pair;
    const seenByThird: { inTransaction: boolean; committed: string[]; own: string[] }[] = [];
    const a = transaction(async () => insert.run("a").changes);
    const b = transaction(async () => insert.run("b").changes);
    const c = transaction(async () => {
      insert.run("c");
      seenByThird.push({
        inTransaction: db.inTransaction,
        // a and b are written but not committed yet: the other connection does not see them.
        committed: committed(),
        own: db
          .prepare<[], { name: string }>("SELECT name FROM t ORDER BY name")
          .all()
          .map((r) => r.name),
      });
      return "c";
    });
    // Nothing runs before the turn ends.
    expect(committed()).toEqual([]);
    await expect(a).resolves.toBe(1);
    // When the first resolves, the whole group is committed.
    expect(committed()).toEqual(["a", "b", "c"]);
    await expect(Promise.all([b, c])).resolves.toEqual([1, "c"]);
    expect(seenByThird).toEqual([{ inTransaction: true, committed: [], own: ["a", "b", "c"] }]);
    expect(db.inTransaction).toBe(false);
  });

  it("splits a turn of more than MAX_GROUP_TRANSACTIONS into groups of that many", async () => {
    tmp = tempDb();
    pair = openPair(tmp.path);
    const { observer, transaction, insert } = pair;
    const countCommitted = observer.prepare<[], { n: number }>("SELECT count(*) AS n FROM t");
    const seen = new Map<number, number>();
    const total = 2 * MAX_GROUP_TRANSACTIONS + 500;
    await Promise.all(
      Array.from({ length: total }, (_, i) =>
        transaction(async () => {
          insert.run(`row ${i}`);
          if (i % MAX_GROUP_TRANSACTIONS === 0 || i % MAX_GROUP_TRANSACTIONS === MAX_GROUP_TRANSACTIONS - 1) {
            seen.set(i, (countCommitted.get() as { n: number }).n);
          }
        }),
      ),
    );
    // Committed before each transaction ran: the groups before its own, whole.
    const m = MAX_GROUP_TRANSACTIONS;
    expect(Object.fromEntries(seen)).toEqual({ 0: 0, [m - 1]: 0, [m]: m, [2 * m - 1]: m, [2 * m]: 2 * m });
    expect((countCommitted.get() as { n: number }).n).toBe(total);
  });

  it("rolls back only the transaction that throws; the others of its group commit", async () => {
    tmp = tempDb();
    pair = openPair(tmp.path);
    const { transaction, insert, committed } = pair;
    const failure = new Error("refused after a write");
    const results = await Promise.allSettled([
      transaction(async () => insert.run("a")),
      transaction(async () => {
        insert.run("b");
        throw failure;
      }),
      transaction(async () => insert.run("b")), // b again: the failed one's b was rolled back
      transaction(async () => insert.run("a")), // a duplicate: SQLITE_CONSTRAINT, rolled back alone
    ]);
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled", "rejected"]);
    expect((results[1] as PromiseRejectedResult).reason).toBe(failure);
    expect(String((results[3] as PromiseRejectedResult).reason)).toMatch(/UNIQUE constraint failed/);
    expect(committed()).toEqual(["a", "b"]);
  });

  it("rejects the whole group when its transaction ends under it, and commits nothing of it", async () => {
    tmp = tempDb();
    pair = openPair(tmp.path);
    const { db, transaction, insert, committed } = pair;
    const ioError = new Error("disk I/O error");
    const results = await Promise.allSettled([
      transaction(async () => insert.run("a")),
      transaction(async () => {
        insert.run("b");
        db.prepare("ROLLBACK").run(); // as SQLite does by itself on some I/O errors
        throw ioError;
      }),
      transaction(async () => insert.run("c")),
    ]);
    expect(results.map((r) => (r.status === "rejected" ? r.reason : r.status))).toEqual([
      ioError,
      ioError,
      ioError,
    ]);
    expect(committed()).toEqual([]);
    expect(db.inTransaction).toBe(false);
    // The next turn's group starts afresh.
    await transaction(async () => insert.run("d"));
    expect(committed()).toEqual(["d"]);
  });

  it("waits for another connection's write lock without blocking the event loop, then commits", async () => {
    tmp = tempDb();
    pair = openPair(tmp.path, 60_000);
    const { transaction, insert, committed } = pair;
    // The other writer is in this thread: it can only let go if the event loop keeps running while
    // the group waits (SQLite's busy handler would sleep in this thread until the timeout).
    const other = new Database(tmp.path);
    try {
      other.prepare("BEGIN IMMEDIATE").run();
      other.prepare("INSERT INTO t (name) VALUES ('other')").run();
      setTimeout(() => other.prepare("COMMIT").run(), 20);
      await Promise.all([transaction(async () => insert.run("a")), transaction(async () => insert.run("b"))]);
      expect(committed()).toEqual(["a", "b", "other"]);
    } finally {
      other.close();
    }
  });

  it("rejects a group whose BEGIN IMMEDIATE finds another connection writing past the busy timeout (SQLITE_BUSY), and goes on after", async () => {
    tmp = tempDb();
    pair = openPair(tmp.path, 0);
    const { transaction, insert, committed } = pair;
    const other = new Database(tmp.path);
    try {
      other.prepare("BEGIN IMMEDIATE").run();
      const results = await Promise.allSettled([
        transaction(async () => insert.run("a")),
        transaction(async () => insert.run("b")),
      ]);
      expect(results.map((r) => r.status)).toEqual(["rejected", "rejected"]);
      expect(String((results[0] as PromiseRejectedResult).reason)).toMatch(/database is locked/);
      other.prepare("COMMIT").run();
      await Promise.all([transaction(async () => insert.run("a")), transaction(async () => insert.run("b"))]);
      expect(committed()).toEqual(["a", "b"]);
    } finally {
      other.close();
    }
  });
});

describe("the SQLite ledger with group commit", () => {
  let tmp: ReturnType<typeof tempDb>;
  afterEach(() => tmp.cleanup());

  it("runs the transactions asked for before close() before the store closes", async () => {
    tmp = tempDb();
    const ledger = await createBudgetLedger({ path: tmp.path, reclaimIntervalMs: 0, leases: false });
    const { id } = await ledger.createKey({ budgetTokens: 1000 });
    const hold = await ledger.placeHold(
      { id, name: "", models: null },
      { promptTokens: 5, prompts: 1, n: 1, maxTokens: 5 },
    );
    // Asked for in the same turn as the close: without a flush it would wait for the turn's end,
    // queued behind the close, and fail on a closed database.
    const settled = ledger.settle(hold.holdId, 7);
    const closed = ledger.close();
    await expect(settled).resolves.toMatchObject({ chargedTokens: 7 });
    await closed;
    const reopened = await createBudgetLedger({ path: tmp.path, reclaimIntervalMs: 0, leases: false });
    try {
      expect((await reopened.usage(id)).spentTokens).toBe(7);
    } finally {
      await reopened.close();
    }
  });

  it("gives concurrent Holds the answers one COMMIT each gives: the same Holds placed, clamped and refused", async () => {
    const outcomes: Record<string, unknown> = {};
    for (const commit of ["each", "group"] as const) {
      tmp = tempDb();
      const ledger = await createBudgetLedger({
        path: tmp.path,
        reclaimIntervalMs: 0,
        leases: false,
        commit,
      });
      try {
        const { id } = await ledger.createKey({ budgetTokens: 1000 });
        const key = { id, name: "", models: null };
        // 40 Holds of 10 + 20 = 30 tokens asked in one turn: 33 fit whole, the 34th is clamped to
        // (1000 − 990 − 10) / 1 = 0 → refused, and so are the rest.
        const placed = await Promise.allSettled(
          Array.from({ length: 40 }, () =>
            ledger.placeHold(key, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 20 }),
          ),
        );
        const summary = placed.map((r) =>
          r.status === "fulfilled"
            ? `held ${r.value.maxTokens}${r.value.clamped ? " clamped" : ""}`
            : "refused",
        );
        // Settle them all in one turn too: each charged 12 of its 30.
        await Promise.all(
          placed.flatMap((r) => (r.status === "fulfilled" ? [ledger.settle(r.value.holdId, 12)] : [])),
        );
        const usage = await ledger.usage(id);
        outcomes[commit] = { summary, spent: usage.spentTokens, held: usage.heldTokens };
      } finally {
        await ledger.close();
        tmp.cleanup();
      }
    }
    expect(outcomes.group).toEqual(outcomes.each);
    const each = outcomes.each as { summary: string[]; spent: number; held: number };
    expect(each.summary.filter((s) => s === "held 20")).toHaveLength(33);
    expect(each.summary.slice(33)).toEqual(Array(7).fill("refused"));
    expect(each.spent).toBe(33 * 12);
    expect(each.held).toBe(0);
    tmp = tempDb(); // for afterEach
  });
});
