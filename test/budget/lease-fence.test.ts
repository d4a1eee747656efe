// ledger.standing() at its edges (src/budget/README.md, "What a crash costs"): an answer read
// after the lease's expiry vouches for nothing; a moved Hold asks other replicas to give back
// their leases' free tokens as placeHold does; a moved Hold is the store's (never reclaimed and
// charged twice here); a move that loses the race with the local reclaim gives its row back; a
// lease renewed on schedule is vouched for without a promise. Clock-driven, both stores. (From a
// hostile review: each case failed on the first version of standing().)
import { describe, expect, it } from "vitest";
import {
  type BudgetLedgerOptions,
  type BudgetStore,
  DEFAULT_LEASE_SETTINGS,
} from "../../src/budget/index.js";
import { clockedLedgers, storesUnderTest } from "./helpers.js";

const TTL = DEFAULT_LEASE_SETTINGS.ttlMs;
const HOLD_TTL = 60_000;

describe.each(storesUnderTest("fence_attack"))("lease fence on $kind", (store) => {
  const { clock, open, rawStore } = clockedLedgers(store, { holdTtlMs: HOLD_TTL });
  const demand = (maxTokens: number) => ({ promptTokens: 0, prompts: 1, n: 1, maxTokens });

  it("a lease step whose answer is read after the lease expired (a stall) vouches for nothing", async () => {
    const other = await open({ instanceId: "other", leases: false });
    const inner = await rawStore();
    let stallAfterNextSync: (() => Promise<void>) | undefined;
    const wrapped: BudgetStore = {
      ...inner,
      async syncLease(input) {
        const outcome = await inner.syncLease(input);
        const stall = stallAfterNextSync;
        stallAfterNextSync = undefined;
        if (stall !== undefined) await stall(); // committed, then the replica stalls before reading the answer
        return outcome;
      },
    };
    const a = await open({
      store: wrapped,
      instanceId: "a",
      leases: { drainPollMs: 3_600_000 },
    } as Partial<BudgetLedgerOptions>);
    const { id, key } = await other.createKey({ budgetTokens: 10_000 });
    const held = await a.placeHold(await a.authenticate(`Bearer ${key}`), demand(100));
    clock.now += (3 * TTL) / 4 + 1; // a late step: the replica must check the lease before delivering
    stallAfterNextSync = async () => {
      clock.now += TTL + 1; // the answer is read only after the lease's expiry
      expect(await other.reclaimStale()).toMatchObject({ leases: 1 });
      // The lease's tokens, the in-flight Hold's too, are granted again.
      await other.placeHold(await other.authenticate(`Bearer ${key}`), demand(10_000));
    };
    const standing = a.standing(held.holdId);
    expect(standing).toBeInstanceOf(Promise);
    const vouched = await standing;
    // The Budget (10,000) is held in full by `other`: the Hold must not be vouched for.
    expect(await other.usage(id)).toMatchObject({ heldTokens: 10_000, leasedTokens: 0 });
    expect(vouched).toBe(false);
  });

  it("a moved Hold asks the other replicas' leases for their free tokens, as placeHold does", async () => {
    const admin = await open({ instanceId: "admin", leases: false });
    const a = await open({ instanceId: "a", leases: { drainPollMs: 3_600_000 } });
    const b = await open({ instanceId: "b", leases: { share: 0.5 } });
    const { id, key } = await admin.createKey({ budgetTokens: 10_000 });
    const onA = await a.placeHold(await a.authenticate(`Bearer ${key}`), demand(100));
    clock.now += TTL + 1; // A stalls past its lease's expiry
    expect(await b.reclaimStale()).toMatchObject({ leases: 1 });
    await b.placeHold(await b.authenticate(`Bearer ${key}`), demand(100)); // B leases 5,000
    await admin.placeHold(await admin.authenticate(`Bearer ${key}`), demand(4_950)); // store: 50 free
    expect(await admin.usage(id)).toMatchObject({ availableTokens: 50, leasedTokens: 5_000 });
    // 4,900 free in B's lease: exactly what drain exists for. A plain placeHold of the same 100
    // tokens is served (B is asked to give its free tokens back) ...
    const standing = await a.standing(onA.holdId);
    const fresh = await admin.placeHold(await admin.authenticate(`Bearer ${key}`), demand(100));
    expect(fresh).toMatchObject({ heldTokens: 100, clamped: false });
    // ... and so is the moved Hold (the first version answered false without asking).
    expect(standing).toBe(true);
  });

  it("a moved Hold is not reclaimed here too: its settle after the store's reclaim charges what was used, once", async () => {
    const other = await open({ instanceId: "other", leases: false });
    const a = await open({ instanceId: "a", leases: { drainPollMs: 3_600_000 } });
    const { id, key } = await other.createKey({ budgetTokens: 10_000 });
    const h = await a.placeHold(await a.authenticate(`Bearer ${key}`), demand(100));
    await a.renew(h.holdId, 30); // confirmed 30
    clock.now += TTL + 1;
    expect(await other.reclaimStale()).toMatchObject({ leases: 1 }); // charges 30
    expect(await a.standing(h.holdId)).toBe(true); // moved into the store (70)
    expect(await a.renew(h.holdId, 80)).toBe(true); // the store row records 80 − 30 = 50
    clock.now += HOLD_TTL + 1; // no renewal for a Hold TTL
    await a.reclaimStale(); // local tombstone "reclaimed, charged 30"; store row reclaimed, charging 50
    expect((await other.usage(id)).spentTokens).toBe(80);
    await a.settle(h.holdId, 90);
    // Used 90: charged 90 (the first version charged 30 + 50 + (90 − 30) = 140).
    expect(await other.usage(id)).toMatchObject({ spentTokens: 90, heldTokens: 0, openHolds: 0 });
  });

  it("a move that loses the race with the local reclaim gives the store's row back (no Hold left open)", async () => {
    const other = await open({ instanceId: "other", leases: false });
    const a = await open({ instanceId: "a", leases: { drainPollMs: 3_600_000 } });
    const { id, key } = await other.createKey({ budgetTokens: 10_000 });
    const h = await a.placeHold(await a.authenticate(`Bearer ${key}`), demand(100));
    clock.now += HOLD_TTL + 1; // a stall longer than the Hold TTL (also past the lease's)
    expect(await other.reclaimStale()).toMatchObject({ leases: 1 });
    const standing = a.standing(h.holdId); // confirm in flight ...
    await a.reclaimStale(); // ... the reclaim timer fires on resume: the local Hold is closed
    expect(await standing).toBe(false); // the local Hold is gone: the row placed for it goes back
    await a.settle(h.holdId, 10);
    expect(await other.usage(id)).toMatchObject({ heldTokens: 0, openHolds: 0 });
  });

  it("a lease stepped every eighth of its TTL (the sync timer's most) is vouched for without a promise at every moment", async () => {
    const admin = await open({ instanceId: "admin", leases: false });
    const a = await open({ instanceId: "a", leases: { ttlMs: 4000, drainPollMs: 3_600_000 } });
    const { key } = await admin.createKey({ budgetTokens: 10_000 });
    const h = await a.placeHold(await a.authenticate(`Bearer ${key}`), demand(100));
    for (let tick = 1; tick <= 12; tick++) {
      clock.now += 500; // the sync timer's ticks (ttlMs / 8: the sync interval is at most an eighth of the TTL)
      // A chunk just before the tick's step: the lease was renewed on schedule, the store is fine.
      expect(a.standing(h.holdId), `tick ${tick}`).toBe(true);
      await a.syncLeases();
    }
  });
});
