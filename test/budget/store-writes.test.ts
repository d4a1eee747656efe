// A SQLite store that cannot write (another connection holds the file's write lock past the busy
// timeout: a real SQLITE_BUSY): the ledger refuses Holds with 503, keeps failed settles and writes
// them once the lock is free, and says when it writes again (src/budget/README.md, "When the store
// fails"). The full-disk and PostgreSQL cases run through the gateway: test/integration/ledger-outage.test.ts.
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import {
  type BudgetLedger,
  createBudgetLedger,
  DEFAULT_LEASE_SETTINGS,
  type WritableChange,
} from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { tempDb } from "./helpers.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves once `cond()` holds; fails after `ms` (a hang guard far above what it takes, not a speed check). */
async function within(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const giveUp = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > giveUp) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(5);
  }
}

describe("a ledger whose store cannot write", () => {
  let tmp: ReturnType<typeof tempDb> | undefined;
  const open: Array<{ close(): unknown }> = [];
  afterEach(async () => {
    for (const o of open.splice(0).reverse()) await o.close();
    tmp?.cleanup();
    tmp = undefined;
  });

  async function setUp(extra: { onReclaimError?: (err: unknown) => void } = {}) {
    tmp = tempDb();
    const changes: WritableChange[] = [];
    const ledger: BudgetLedger = await createBudgetLedger({
      path: tmp.path,
      busyTimeoutMs: 20,
      leases: false,
      reclaimIntervalMs: 0,
      onWritableChange: (c) => changes.push(c),
      ...extra,
    });
    const other = new Database(tmp.path);
    open.push(ledger, other);
    const { id } = await ledger.createKey({ budgetTokens: 1000 });
    const key = { id, name: "", models: null };
    /** Holds the file's write lock (another connection's BEGIN IMMEDIATE) until the returned function is called. */
    const lock = () => {
      other.prepare("BEGIN IMMEDIATE").run();
      return () => other.prepare("COMMIT").run();
    };
    return { ledger, key, lock, changes, path: tmp.path };
  }
  const demand = { promptTokens: 10, prompts: 1, n: 1, maxTokens: 90 };

  it("a Hold the store cannot place is 503 upstream_unavailable (retry in 1 s); with nothing else writing, the ledger finds the store writable again", async () => {
    const { ledger, key, lock, changes } = await setUp();
    const unlock = lock();
    const refused = await ledger.placeHold(key, demand).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(refused).toBeInstanceOf(ApiError);
    expect(refused).toMatchObject({
      code: "upstream_unavailable",
      status: 503,
      retry: { retry: true, afterSeconds: 1 },
      cause: { code: "SQLITE_BUSY" },
    });
    expect((refused as Error).message).toMatch(/^The Budget ledger is unavailable .* Retry the request\.$/);
    expect(ledger.writable).toBe(false);
    unlock();
    // No request comes (a load balancer sends none to a replica that is not ready): the probe writes.
    await within(() => ledger.writable, "writable again");
    expect(changes.map((c) => c.writable)).toEqual([false, true]);
    expect(await ledger.usage(key.id)).toMatchObject({ spentTokens: 0, heldTokens: 0, openHolds: 0 });
  });

  it("a Hold settled twice while its settle waits is written once; its tokens stay held until then", async () => {
    const { ledger, key, lock, changes } = await setUp();
    const hold = await ledger.placeHold(key, demand);
    const unlock = lock();
    expect(await ledger.settle(hold.holdId, 40)).toMatchObject({ outcome: "pending", chargedTokens: 0 });
    expect(await ledger.settle(hold.holdId, 40)).toMatchObject({ outcome: "pending" });
    expect(ledger.pendingSettles).toBe(1);
    expect(changes.at(-1)).toMatchObject({ writable: false, pendingSettles: 1, pendingTokens: 40 });
    unlock();
    await within(() => ledger.writable, "the settle written");
    expect(await ledger.usage(key.id)).toMatchObject({
      spentTokens: 40,
      heldTokens: 0,
      openHolds: 0,
      settledHolds: 1,
    });
    expect(await ledger.settle(hold.holdId, 40)).toMatchObject({ outcome: "already_settled" });
  });

  it("a close with a settle still waiting reports it; the Hold stays reserved and a restart reclaims it at its last renewal", async () => {
    const errors: unknown[] = [];
    const { ledger, key, lock, path } = await setUp({ onReclaimError: (e) => errors.push(e) });
    const hold = await ledger.placeHold(key, demand);
    await ledger.renew(hold.holdId, 15);
    const unlock = lock();
    expect(await ledger.settle(hold.holdId, 60)).toMatchObject({ outcome: "pending" });
    await ledger.close();
    unlock();
    expect(String(errors.at(-1))).toMatch(
      /1 settles \(60 tokens used\) could not be written before the close: their Holds stay open/,
    );
    const again = await createBudgetLedger({ path, leases: false, reclaimIntervalMs: 0 });
    open.push(again);
    expect(await again.usage(key.id)).toMatchObject({ spentTokens: 0, heldTokens: 100, openHolds: 1 });
    expect(await again.reclaimOnStart()).toEqual({ holds: 1, leases: 0 });
    // The crash's cost: the settle's 60 lost, its last renewal's 15 charged; nothing overspent.
    expect(await again.usage(key.id)).toMatchObject({ spentTokens: 15, heldTokens: 0, openHolds: 0 });
  });
});

// The writes of lease-backed Holds that end in the store (issue 33): a Hold whose lease another
// replica reclaimed while this one stalled is charged late, or moves into the store; either write
// that fails is kept and written again like a settle, once per Hold.
describe("a lease-backed Hold ended while the store cannot write", () => {
  let tmp: ReturnType<typeof tempDb> | undefined;
  const open: Array<{ close(): unknown }> = [];
  afterEach(async () => {
    for (const o of open.splice(0).reverse()) await o.close();
    tmp?.cleanup();
    tmp = undefined;
  });

  /**
   * A replica with leases (`stalled`) and one without (`other`) on one clock, a key of 10,000
   * tokens and a Hold of 100 on stalled's lease renewed at 30; the clock then passes the lease's
   * expiry and `other` reclaims the lease (charging the renewal's 30). `lock()` holds the file's
   * write lock from a third connection (a real SQLITE_BUSY past the busy timeout).
   */
  async function lostLease() {
    tmp = tempDb();
    const clock = { ms: 1_900_000_000_000 };
    const common = { path: tmp.path, busyTimeoutMs: 20, reclaimIntervalMs: 0, now: () => clock.ms };
    const stalled = await createBudgetLedger({
      ...common,
      instanceId: "stalled",
      leases: { drainPollMs: 3_600_000 },
      onReclaimError: () => undefined,
    });
    const other = await createBudgetLedger({ ...common, instanceId: "other", leases: false });
    const locker = new Database(tmp.path);
    open.push(stalled, other, locker);
    const { id, key } = await other.createKey({ budgetTokens: 10_000 });
    const info = await stalled.authenticate(`Bearer ${key}`);
    const hold = await stalled.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 100 });
    await stalled.renew(hold.holdId, 30);
    clock.ms += DEFAULT_LEASE_SETTINGS.ttlMs + 1;
    expect(await other.reclaimStale()).toEqual({ holds: 0, leases: 1 });
    const lock = () => {
      locker.prepare("BEGIN IMMEDIATE").run();
      return () => locker.prepare("COMMIT").run();
    };
    return { stalled, other, id, hold, lock };
  }

  it("a Hold of a lost lease: its late charge is kept, written once the store writes, charged once", async () => {
    const { stalled, other, id, hold, lock } = await lostLease();
    await stalled.syncLeases(); // its step finds the lease lost
    const unlock = lock();
    try {
      expect(await stalled.settle(hold.holdId, 80)).toMatchObject({ outcome: "pending", chargedTokens: 0 });
      expect(stalled.writable).toBe(false);
      expect(stalled.pendingSettles).toBe(1);
      expect(await stalled.settle(hold.holdId, 80)).toMatchObject({ outcome: "already_settled" });
    } finally {
      unlock();
    }
    await within(() => stalled.writable, "the late charge written");
    // 30 by the reclaim, the other 50 by the late charge: once.
    expect(await other.usage(id)).toMatchObject({
      spentTokens: 80,
      heldTokens: 0,
      leasedTokens: 0,
      openHolds: 0,
    });
    expect(await stalled.settle(hold.holdId, 80)).toMatchObject({ outcome: "already_settled" });
    expect((await other.usage(id)).spentTokens).toBe(80);
  });

  it("a Hold moved into the store from a lost lease: its settle is kept, written once the store writes, charged once", async () => {
    const { stalled, other, id, hold, lock } = await lostLease();
    expect(await stalled.standing(hold.holdId)).toBe(true); // 70 more held in the store, one Hold
    expect(await other.usage(id)).toMatchObject({ spentTokens: 30, heldTokens: 70, openHolds: 1 });
    const unlock = lock();
    try {
      expect(await stalled.settle(hold.holdId, 80)).toMatchObject({ outcome: "pending", chargedTokens: 0 });
      expect(stalled.writable).toBe(false);
    } finally {
      unlock();
    }
    await within(() => stalled.writable, "the moved Hold's settle written");
    expect(await other.usage(id)).toMatchObject({
      spentTokens: 80,
      heldTokens: 0,
      leasedTokens: 0,
      openHolds: 0,
    });
    expect(await stalled.settle(hold.holdId, 80)).toMatchObject({ outcome: "already_settled" });
    expect((await other.usage(id)).spentTokens).toBe(80);
  });
});
