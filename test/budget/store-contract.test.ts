// The BudgetStore contract (src/budget/budget-store.ts), one suite that every store passes: the
// SQLite store and the PostgreSQL store (src/budget/stores/) give the same answers, the same
// numbers and the same refusals, method by method, without a ledger in front.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  type BudgetStore,
  createPostgresBudgetStore,
  createSqliteBudgetStore,
  type HoldDemand,
  type KeyRecord,
  type KeyState,
  type LeaseSyncInput,
} from "../../src/budget/index.js";
import { storesUnderTest } from "./helpers.js";

/** The suite's clock (Unix epoch ms) and its UTC day. */
const T = 1_900_000_000_000;
const DAY = "2030-03-17";
const TTL = 60_000;

/** A key record numbered `n`: id, hash and creation time follow from it. */
function keyRecord(n: number, budgetTokens: number, extra: Partial<KeyRecord> = {}): KeyRecord {
  return {
    id: `key_${n.toString(16).padStart(12, "0")}`,
    keyHash: new Uint8Array(32).fill(n),
    hint: `acs-…${n}`,
    name: `key ${n}`,
    budgetTokens,
    spentTokens: 0,
    models: null,
    createdAt: T + n,
    revokedAt: null,
    ...extra,
  };
}

/** A key record with its hash as hex, to compare across backends (a Buffer or a Uint8Array). */
const comparable = (k: KeyRecord | undefined) =>
  k === undefined ? undefined : { ...k, keyHash: Buffer.from(k.keyHash).toString("hex") };

const demand = (maxTokens: number, extra: Partial<HoldDemand> = {}): HoldDemand => ({
  promptTokens: 0,
  prompts: 1,
  n: 1,
  maxTokens,
  ...extra,
});

describe.each(storesUnderTest("store_contract"))("the BudgetStore contract on $kind", (under) => {
  let store: BudgetStore;
  beforeAll(() => under.setup());
  afterAll(() => under.teardown());
  beforeEach(async (ctx) => {
    await under.fresh(ctx);
    const o = under.options();
    store =
      "path" in o
        ? createSqliteBudgetStore({ path: o.path })
        : await createPostgresBudgetStore({ url: o.postgresUrl });
  });
  afterEach(async () => {
    await store?.close().catch(() => undefined);
    under.cleanup();
  });

  /** Inserts key `n` with `budgetTokens` and returns its id. */
  const key = async (n: number, budgetTokens: number, extra: Partial<KeyRecord> = {}) => {
    const record = keyRecord(n, budgetTokens, extra);
    await store.insertKey(record);
    return record.id;
  };
  /** Places Hold `holdId` of `instanceId` on keyId, expiring a TTL after T. */
  const hold = (holdId: string, keyId: string, d: HoldDemand, instanceId = "a", drainOthersUntil?: number) =>
    store.placeHold({
      holdId,
      keyId,
      demand: d,
      instanceId,
      now: T,
      expiresAt: T + TTL,
      ...(drainOthersUntil === undefined ? {} : { drainOthersUntil }),
    });
  /** A lease step of `leaseId` on keyId: nothing charged, released, grown or closed but what `over` says. */
  const step = (
    keyId: string,
    over: Partial<LeaseSyncInput> & Pick<LeaseSyncInput, "seq">,
  ): LeaseSyncInput => ({
    leaseId: "lease_1",
    keyId,
    instanceId: "a",
    now: T,
    day: DAY,
    expiresAt: T + TTL,
    charge: 0,
    settled: 0,
    chargeIfLost: 0,
    release: 0,
    reclaimCharge: 0,
    holds: 0,
    acknowledgeDrain: false,
    closing: false,
    close: false,
    ...over,
  });

  it("keys: inserted, found by hash, listed oldest first; a repeated id or hash is refused", async () => {
    expect(store.kind).toBe(under.kind);
    const second = keyRecord(2, 500, { models: ["m-a", "m-b"], revokedAt: T + 9 });
    await store.insertKey(second);
    await key(1, 1000);
    expect(comparable(await store.findKeyByHash(second.keyHash))).toMatchObject(comparable(second) ?? {});
    expect(await store.findKeyByHash(new Uint8Array(32).fill(7))).toBeUndefined();
    expect((await store.listKeys()).map((k) => k.id)).toEqual([keyRecord(1, 0).id, second.id]);
    await expect(
      store.insertKey(keyRecord(1, 10, { keyHash: new Uint8Array(32).fill(9) })),
    ).rejects.toThrow();
    await expect(store.insertKey(keyRecord(3, 10, { keyHash: second.keyHash }))).rejects.toThrow();
    expect(await store.listKeys()).toHaveLength(2);
  });

  it("addBudget and revokeKey: true for a known key, false for an unknown one; a second revoke keeps the first time", async () => {
    const id = await key(1, 100);
    expect(await store.addBudget(id, 50)).toBe(true);
    expect(await store.addBudget("key_ffffffffffff", 50)).toBe(false);
    expect(await store.revokeKey(id, T + 5)).toBe(true);
    expect(await store.revokeKey(id, T + 6)).toBe(true);
    expect(await store.revokeKey("key_ffffffffffff", T)).toBe(false);
    expect(await store.keyUsage(id)).toMatchObject({ budgetTokens: 150, revokedAt: T + 5 });
    expect(await hold("h1", id, demand(10))).toEqual({ kind: "revoked" });
    expect(await hold("h2", "key_ffffffffffff", demand(10))).toEqual({ kind: "unknown_key" });
  });

  it("placeHold: whole, clamped, refused with the numbers, `count` for a bound that does not fit; a bad demand throws", async () => {
    const id = await key(1, 1000);
    expect(await hold("h1", id, demand(100, { promptTokens: 10, n: 2 }))).toEqual({
      kind: "held",
      tokens: 210,
      maxTokens: 100,
      clamped: false,
    });
    expect(await hold("h2", id, demand(500, { promptTokens: 10, n: 2 }))).toEqual({
      kind: "held",
      tokens: 790,
      maxTokens: 390,
      clamped: true,
    });
    expect(await hold("h3", id, demand(5, { promptTokens: 10, n: 2 }))).toEqual({
      kind: "insufficient",
      minimumTokens: 12,
      budgetTokens: 1000,
      spentTokens: 0,
      heldTokens: 1000,
    });
    expect(await store.settleHold("h1", 150, T + 1, DAY)).toEqual({
      outcome: "settled",
      chargedTokens: 150,
      releasedTokens: 60,
    });
    expect(await hold("h4", id, demand(1, { promptTokens: 100, promptTokensBound: true }))).toEqual({
      kind: "count",
    });
    expect(await hold("h5", id, demand(5, { promptTokens: 10, promptTokensBound: true }))).toMatchObject({
      kind: "held",
      tokens: 15,
    });
    await expect(hold("h6", id, demand(0))).rejects.toThrow(RangeError);
    expect(await store.keyUsage(id)).toMatchObject({ spentTokens: 150, heldTokens: 805, openHolds: 2 });
  });

  it("settleHold: once (a repeat changes nothing), undefined for an unknown Hold", async () => {
    const id = await key(1, 1000);
    await hold("h1", id, demand(200));
    expect(await store.settleHold("h1", 500, T + 1, DAY)).toEqual({
      outcome: "settled",
      chargedTokens: 200,
      releasedTokens: 0,
    });
    expect(await store.settleHold("h1", 10, T + 2, DAY)).toEqual({
      outcome: "already_settled",
      chargedTokens: 0,
      releasedTokens: 0,
    });
    expect(await store.settleHold("h_unknown", 10, T, DAY)).toBeUndefined();
    const usage = await store.keyUsage(id);
    expect(usage).toMatchObject({ spentTokens: 200, heldTokens: 0, openHolds: 0, settledHolds: 1 });
    expect(usage?.daily).toEqual([{ day: DAY, chargedTokens: 200, settledHolds: 1, reclaimedHolds: 0 }]);
  });

  it("renewHold and reclaimExpired: the most recorded use is charged at the expiry; a late settle gets only what is free", async () => {
    const id = await key(1, 100);
    await hold("h1", id, demand(80));
    expect(await store.renewHold("h1", T + 2 * TTL, 30)).toBe(true);
    expect(await store.renewHold("h1", T + 2 * TTL, 10)).toBe(true);
    expect(await store.renewHold("h_unknown", T + 2 * TTL, 10)).toBe(false);
    expect(await store.reclaimExpired(T + TTL + 1, DAY)).toEqual({ holds: 0, leases: 0 });
    expect(await store.reclaimExpired(T + 2 * TTL, DAY)).toEqual({ holds: 1, leases: 0 });
    expect(await store.renewHold("h1", T + 3 * TTL, 40)).toBe(false);
    expect(await store.keyUsage(id)).toMatchObject({ spentTokens: 30, heldTokens: 0, reclaimedHolds: 1 });
    await hold("h2", id, demand(50));
    expect(await store.settleHold("h1", 60, T + 3, DAY)).toEqual({
      outcome: "settled_after_reclaim",
      chargedTokens: 20,
      releasedTokens: 0,
    });
    expect(await store.settleHold("h1", 60, T + 4, DAY)).toMatchObject({ outcome: "already_settled" });
    expect(await store.keyUsage(id)).toMatchObject({ spentTokens: 50, heldTokens: 50, settledHolds: 1 });
  });

  it("chargeLate: up to what is free, once per Hold id; nothing for an unknown key", async () => {
    const id = await key(1, 100);
    const late = { keyId: id, instanceId: "a", now: T, day: DAY };
    expect(await store.chargeLate({ ...late, holdId: "late1", tokens: 30 })).toBe(30);
    expect(await store.chargeLate({ ...late, holdId: "late1", tokens: 30 })).toBe(0);
    expect(await store.chargeLate({ ...late, holdId: "late2", tokens: 200 })).toBe(70);
    expect(await store.chargeLate({ ...late, keyId: "key_ffffffffffff", holdId: "late3", tokens: 5 })).toBe(
      0,
    );
    expect(await store.keyUsage(id)).toMatchObject({ spentTokens: 100, settledHolds: 2, openHolds: 0 });
  });

  it("syncLease: a first step grows the lease, a retry answers as then, a step out of order or beyond the lease throws", async () => {
    const id = await key(1, 1000);
    const grown = await store.syncLease(step(id, { seq: 1, grow: () => 300 }));
    const state: KeyState = {
      budgetTokens: 1000,
      spentTokens: 0,
      heldTokens: 0,
      leasedTokens: 300,
      revokedAt: null,
      leaseBlockUntil: 0,
    };
    expect(grown).toEqual({ kind: "synced", granted: 300, tokens: 300, drain: false, key: state });
    expect(await store.syncLease(step(id, { seq: 1, grow: () => 300 }))).toEqual(grown);
    await expect(store.syncLease(step(id, { seq: 3 }))).rejects.toThrow(/out of order/);
    await expect(store.syncLease(step(id, { seq: 2, charge: 200, release: 101 }))).rejects.toThrow(
      /> its 300/,
    );
    const other = await key(2, 10);
    await expect(store.syncLease(step(other, { seq: 2 }))).rejects.toThrow(/is not a lease of/);
    const settled = { seq: 2, charge: 50, settled: 2, release: 100, reclaimCharge: 20, holds: 1 };
    expect(await store.syncLease(step(id, settled))).toEqual({
      kind: "synced",
      granted: 0,
      tokens: 150,
      drain: false,
      key: { ...state, spentTokens: 50, leasedTokens: 150 },
    });
    expect(await store.keyUsage(id)).toMatchObject({
      spentTokens: 50,
      leasedTokens: 150,
      leases: 1,
      settledHolds: 2,
    });
    const closed = await store.syncLease(step(id, { seq: 3, close: true, grow: () => 999 }));
    expect(closed).toMatchObject({ kind: "synced", granted: 0, tokens: 0, key: { leasedTokens: 0 } });
    await expect(store.syncLease(step(id, { seq: 4 }))).rejects.toThrow(/out of order/);
    expect(await store.keyUsage(id)).toMatchObject({ spentTokens: 50, leasedTokens: 0, leases: 0 });
  });

  it("syncLease of a lost lease: reclaimed at its expiry (its reclaimCharge), then each step charges what is due up to what is free", async () => {
    const id = await key(1, 1000);
    await store.syncLease(step(id, { seq: 1, grow: () => 300 }));
    await store.syncLease(
      step(id, { seq: 2, charge: 50, settled: 2, release: 100, reclaimCharge: 20, holds: 1 }),
    );
    expect(await store.reclaimExpired(T + TTL, DAY)).toEqual({ holds: 0, leases: 1 });
    const lostStep = step(id, { seq: 3, chargeIfLost: 40, settled: 1, charge: 60 });
    expect(await store.syncLease(lostStep)).toEqual({ kind: "lost", charged: 40 });
    expect(await store.syncLease(lostStep)).toEqual({ kind: "lost", charged: 40 });
    expect(await store.syncLease(step(id, { leaseId: "lease_gone", seq: 2, chargeIfLost: 5000 }))).toEqual({
      kind: "lost",
      charged: 890,
    });
    const usage = await store.keyUsage(id);
    expect(usage).toMatchObject({
      spentTokens: 1000,
      leasedTokens: 0,
      leases: 0,
      settledHolds: 3,
      reclaimedHolds: 1,
    });
    expect(usage?.daily).toEqual([{ day: DAY, chargedTokens: 1000, settledHolds: 3, reclaimedHolds: 1 }]);
  });

  it("a Hold that does not fit while another replica's lease holds tokens asks it to drain, and blocks new leases until then", async () => {
    const id = await key(1, 1000);
    await store.syncLease(step(id, { leaseId: "lease_b", instanceId: "b", seq: 1, grow: () => 900 }));
    expect(await hold("h1", id, demand(200), "a", T + 5000)).toEqual({ kind: "drain_requested", leases: 1 });
    expect(await store.drainRequests("b")).toEqual(["lease_b"]);
    expect(await store.drainRequests("a")).toEqual([]);
    expect(await store.drainsPending(id, T)).toBe(1);
    expect(await store.drainsPending(id, T, "b")).toBe(0);
    let seen: KeyState | undefined;
    const given = step(id, {
      leaseId: "lease_b",
      instanceId: "b",
      seq: 2,
      release: 900,
      acknowledgeDrain: true,
    });
    const back = await store.syncLease({
      ...given,
      grow: (_free, k) => {
        seen = k;
        return 0;
      },
    });
    expect(back).toMatchObject({ kind: "synced", tokens: 0, drain: false });
    expect(seen).toMatchObject({ leaseBlockUntil: T + 5000, leasedTokens: 0 });
    expect(await store.drainRequests("b")).toEqual([]);
    expect(await hold("h1", id, demand(200), "a", T + 5000)).toMatchObject({ kind: "held", tokens: 200 });
    await store.syncLease(step(id, { leaseId: "lease_c", instanceId: "c", seq: 1, grow: () => 10 }));
    expect(await store.revokeKey(id, T + 1)).toBe(true);
    expect(await store.drainRequests("c")).toEqual(["lease_c"]);
    const revoked = await store.syncLease(
      step(id, { leaseId: "lease_d", instanceId: "d", seq: 1, grow: () => 10 }),
    );
    expect(revoked).toMatchObject({ kind: "synced", granted: 0, tokens: 0 });
  });

  it("reclaimOpen: an instance's open Holds and leases, or every one; purgeClosed deletes what closed before a time", async () => {
    const id = await key(1, 1000);
    await hold("ha", id, demand(10), "a");
    await hold("hb", id, demand(20), "b");
    await store.syncLease(
      step(id, { leaseId: "lease_b", instanceId: "b", seq: 1, grow: () => 30, reclaimCharge: 0 }),
    );
    expect(await store.reclaimOpen(T + 1, DAY, "a")).toEqual({ holds: 1, leases: 0 });
    expect(await store.reclaimOpen(T + 2, DAY)).toEqual({ holds: 1, leases: 1 });
    expect(await store.reclaimOpen(T + 3, DAY)).toEqual({ holds: 0, leases: 0 });
    expect(await store.keyUsage(id)).toMatchObject({
      spentTokens: 0,
      heldTokens: 0,
      leasedTokens: 0,
      reclaimedHolds: 2,
    });
    expect(await store.purgeClosed(T + 2)).toBe(1);
    expect(await store.purgeClosed(T + 3)).toBe(2);
    expect(await store.settleHold("ha", 5, T + 4, DAY)).toBeUndefined();
  });

  it("keyUsage: the last `days` days, newest first; undefined for an unknown key; probeWrite resolves; a closed store throws", async () => {
    const id = await key(1, 1000);
    for (const [i, day] of ["2030-03-15", "2030-03-16", "2030-03-17"].entries()) {
      await store.chargeLate({
        holdId: `late${i}`,
        keyId: id,
        tokens: 10 * (i + 1),
        instanceId: "a",
        now: T,
        day,
      });
    }
    expect((await store.keyUsage(id, 2))?.daily).toEqual([
      { day: "2030-03-17", chargedTokens: 30, settledHolds: 1, reclaimedHolds: 0 },
      { day: "2030-03-16", chargedTokens: 20, settledHolds: 1, reclaimedHolds: 0 },
    ]);
    expect(await store.keyUsage(id)).toMatchObject({ spentTokens: 60, settledHolds: 3 });
    expect(await store.keyUsage("key_ffffffffffff")).toBeUndefined();
    await expect(store.probeWrite()).resolves.toBeUndefined();
    await store.close();
    await expect(store.listKeys()).rejects.toThrow();
  });
});
