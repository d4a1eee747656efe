// Leases (src/budget/README.md, "Leases"), on both stores: a replica serves Holds from memory and
// still answers exactly as one transaction per Hold; several replicas never overspend and give
// free tokens back to one that needs them; a killed replica's lease is reclaimed, charging what
// its Holds' renewals recorded; a lost lease never charges twice.
import fc from "fast-check";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  type BudgetLedger,
  type BudgetLedgerOptions,
  createBudgetLedger,
  createPostgresBudgetStore,
  createSqliteBudgetStore,
  DEFAULT_LEASE_SETTINGS,
  type HoldDemand,
  type KeyInfo,
  type LeaseSyncInput,
} from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { exited, lineReader, spawnFixture, storesUnderTest } from "./helpers.js";

const outcomeOf = async <T>(p: Promise<T>): Promise<T | { refused: string }> => {
  try {
    return await p;
  } catch (err) {
    if (err instanceof ApiError) return { refused: err.code };
    throw err;
  }
};

describe.each(storesUnderTest("leases"))("leases on $kind", (store) => {
  const ledgers: BudgetLedger[] = [];
  const open = async (extra: Partial<BudgetLedgerOptions> = {}) => {
    const ledger = await createBudgetLedger({
      ...store.options(),
      reclaimIntervalMs: 0,
      authCacheTtlMs: 0,
      leases: true,
      ...extra,
    } as BudgetLedgerOptions);
    ledgers.push(ledger);
    return ledger;
  };

  beforeAll(() => store.setup());
  afterAll(() => store.teardown());
  beforeEach((ctx) => store.fresh(ctx));
  afterEach(async () => {
    for (const l of ledgers.splice(0)) await l.close();
    store.cleanup();
  });

  async function keyOn(ledger: BudgetLedger, budgetTokens: number) {
    const { id, key } = await ledger.createKey({ budgetTokens });
    return { id, key, info: (await ledger.authenticate(`Bearer ${key}`)) as KeyInfo };
  }

  it("serves Holds from a lease: the store sees the lease, not the Holds; settles reach it at the next sync", async () => {
    const ledger = await open({ instanceId: "a" });
    const { id, info } = await keyOn(ledger, 100_000);
    const demand = { promptTokens: 10, prompts: 1, n: 1, maxTokens: 90 };
    const holds = [];
    for (let i = 0; i < 10; i++) holds.push(await ledger.placeHold(info, demand));
    expect(holds.every((h) => h.heldTokens === 100 && !h.clamped)).toBe(true);
    const leased = 100_000 * DEFAULT_LEASE_SETTINGS.share;
    expect(await ledger.usage(id)).toMatchObject({
      leasedTokens: leased,
      leases: 1,
      openHolds: 0,
      heldTokens: 0,
      availableTokens: 100_000 - leased,
    });
    for (const h of holds) expect((await ledger.settle(h.holdId, 60)).chargedTokens).toBe(60);
    expect((await ledger.settle(holds[0]?.holdId ?? "", 60)).outcome).toBe("already_settled");
    expect((await ledger.usage(id)).spentTokens).toBe(0); // not flushed yet
    await ledger.syncLeases();
    expect(await ledger.usage(id)).toMatchObject({
      spentTokens: 600,
      leasedTokens: leased - 600,
      settledHolds: 10,
    });
    await ledger.close();
    expect(await ledger.usage(id).catch(() => "closed")).toBe("closed");
    const admin = await open({ leases: false });
    expect(await admin.usage(id)).toMatchObject({ spentTokens: 600, leasedTokens: 0, leases: 0 });
  });

  it("one replica with leases answers exactly as one transaction per Hold (random sequences)", async () => {
    const admin = await open({ leases: false });
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 50, max: 5000 }),
        fc.array(
          fc.oneof(
            fc.record({
              op: fc.constant("place" as const),
              promptTokens: fc.integer({ min: 0, max: 60 }),
              prompts: fc.integer({ min: 1, max: 2 }),
              n: fc.integer({ min: 1, max: 2 }),
              maxTokens: fc.integer({ min: 1, max: 300 }),
              captureReplay: fc.boolean(),
            }),
            fc.record({
              op: fc.constant("settle" as const),
              pick: fc.nat(),
              fraction: fc.double({ min: 0, max: 1.2, noNaN: true }),
            }),
            fc.record({
              op: fc.constant("renew" as const),
              pick: fc.nat(),
              fraction: fc.double({ min: 0, max: 1, noNaN: true }),
            }),
          ),
          { maxLength: 25 },
        ),
        async (budget, ops) => {
          const leased = await open({ instanceId: "leased", leases: { minHolds: 2, share: 0.3 } });
          const plain = await open({ instanceId: "plain", leases: false });
          try {
            const k1 = await keyOn(admin, budget);
            const k2 = await keyOn(admin, budget);
            const sides = [
              {
                ledger: leased,
                info: k1.info,
                id: k1.id,
                open: [] as { holdId: string; heldTokens: number }[],
              },
              {
                ledger: plain,
                info: k2.info,
                id: k2.id,
                open: [] as { holdId: string; heldTokens: number }[],
              },
            ];
            for (const op of ops) {
              const results = [];
              for (const side of sides) {
                if (op.op === "place") {
                  const { op: _, ...demand } = op;
                  const r = await outcomeOf(side.ledger.placeHold(side.info, demand as HoldDemand));
                  if ("holdId" in r) side.open.push(r);
                  results.push("holdId" in r ? { ...r, holdId: "" } : r);
                } else if (side.open.length > 0) {
                  const i = op.pick % side.open.length;
                  const hold = side.open[i] as { holdId: string; heldTokens: number };
                  const used = Math.floor(hold.heldTokens * op.fraction);
                  if (op.op === "settle") {
                    side.open.splice(i, 1);
                    results.push(await side.ledger.settle(hold.holdId, used));
                  } else results.push(await side.ledger.renew(hold.holdId, used));
                }
              }
              expect(results[0]).toEqual(results[1]);
            }
            for (const side of sides)
              for (const h of side.open) await side.ledger.settle(h.holdId, h.heldTokens);
            await leased.close();
            const [u1, u2] = [await admin.usage(k1.id), await admin.usage(k2.id)];
            expect({ ...u1, id: "", hint: "", createdAt: 0 }).toEqual({
              ...u2,
              id: "",
              hint: "",
              createdAt: 0,
            });
            expect(u1).toMatchObject({ leasedTokens: 0, heldTokens: 0 });
          } finally {
            await leased.close();
            await plain.close();
          }
        },
      ),
      { numRuns: store.kind === "postgres" ? 15 : 40 },
    );
  });

  it.each([
    ["spread over both", (i: number) => i % 2, () => 0],
    // The first 20 to replica a (it takes leases, then idles), the rest to b: b must get the free
    // tokens a's leases still have, or it starves below 100.
    [
      "20 to one replica first, 480 to the other",
      (i: number) => (i < 20 ? 0 : 1),
      (i: number) => (i < 20 ? 0 : 50),
    ],
  ])(
    "two replicas, 500 concurrent requests %s, a Budget that fits exactly 100: exactly 100 served",
    async (_, replicaOf, delayOf) => {
      const a = await open({ instanceId: "a", leases: { drainPollMs: 20 } });
      const b = await open({ instanceId: "b", leases: { drainPollMs: 20 } });
      const admin = await open({ leases: false });
      const { id, key } = await admin.createKey({ budgetTokens: 100 * 100 });
      const infos = [await a.authenticate(`Bearer ${key}`), await b.authenticate(`Bearer ${key}`)];
      let worst = 0;
      let samples = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const u = await admin.usage(id);
          worst = Math.max(worst, u.spentTokens + u.heldTokens + u.leasedTokens);
          samples++;
          await new Promise((r) => setTimeout(r, 2));
        }
      })();
      const outcomes = await Promise.all(
        Array.from({ length: 500 }, async (_, i) => {
          const ledger = replicaOf(i) === 0 ? a : b;
          await new Promise((r) => setTimeout(r, delayOf(i) + (i % 7)));
          const r = await outcomeOf(
            ledger.placeHold(infos[replicaOf(i)] as KeyInfo, {
              promptTokens: 10,
              prompts: 1,
              n: 1,
              maxTokens: 90,
            }),
          );
          if (!("holdId" in r)) return r.refused;
          await new Promise((res) => setTimeout(res, i % 5));
          await ledger.settle(r.holdId, r.heldTokens);
          return r.clamped ? "clamped" : "served";
        }),
      );
      sampling = false;
      await sampler;
      expect(outcomes.filter((o) => o === "served")).toHaveLength(100);
      expect(outcomes.filter((o) => o === "insufficient_quota")).toHaveLength(400);
      await a.close();
      await b.close();
      expect(await admin.usage(id)).toMatchObject({
        spentTokens: 10_000,
        heldTokens: 0,
        leasedTokens: 0,
        openHolds: 0,
        leases: 0,
        settledHolds: 100,
      });
      expect(samples).toBeGreaterThan(0);
      expect(worst).toBeLessThanOrEqual(10_000);
    },
  );

  it("an idle replica gives its lease's free tokens back when another replica needs them", async () => {
    const idle = await open({ instanceId: "idle", leases: { share: 0.5, drainPollMs: 20 } });
    const busy = await open({ instanceId: "busy", leases: { share: 0.5, drainPollMs: 20 } });
    const { id, key } = await (await open({ leases: false })).createKey({ budgetTokens: 1000 });
    const h = await idle.placeHold(await idle.authenticate(`Bearer ${key}`), {
      promptTokens: 0,
      prompts: 1,
      n: 1,
      maxTokens: 100,
    });
    await idle.settle(h.holdId, 100); // the lease of 500 has 400 free, 100 charged (not yet flushed)
    const admin = await open({ leases: false });
    expect(await admin.usage(id)).toMatchObject({ leasedTokens: 500, availableTokens: 500 });
    // 551 do not fit in the 500 the store has free: only with the idle lease's 400 back.
    const big = await busy.placeHold(await busy.authenticate(`Bearer ${key}`), {
      promptTokens: 550,
      prompts: 1,
      n: 1,
      maxTokens: 50,
    });
    expect(big).toMatchObject({ heldTokens: 600, clamped: false });
    expect(await admin.usage(id)).toMatchObject({
      spentTokens: 100,
      heldTokens: 600,
      leasedTokens: 0,
      leases: 0,
    });
  });

  it("revoke resolves once the leasing replicas confirmed it: their next placeHold is refused from memory", async () => {
    const replica = await open({ instanceId: "r", leases: { drainPollMs: 20 } });
    const admin = await open({ leases: false });
    const { id, key } = await admin.createKey({ budgetTokens: 100_000 });
    const info = await replica.authenticate(`Bearer ${key}`);
    const demand = { promptTokens: 0, prompts: 1, n: 1, maxTokens: 10 };
    const inFlight = await replica.placeHold(info, demand);
    await admin.revoke(id);
    const err = await outcomeOf(replica.placeHold(info, demand));
    expect(err).toEqual({ refused: "invalid_api_key" });
    expect((await replica.settle(inFlight.holdId, 10)).chargedTokens).toBe(10); // a request in flight still settles
    await replica.syncLeases();
    expect(await admin.usage(id)).toMatchObject({ spentTokens: 10, leasedTokens: 0, leases: 0 });
  });

  it("a killed replica's lease is reclaimed after its expiry: charged its flushed settles and its Holds' renewals", async () => {
    const admin = await open({ leases: false });
    const { id, key } = await admin.createKey({ budgetTokens: 100_000 });
    const child = spawnFixture("lease-child.ts", [store.acsDb(), key]);
    const state = JSON.parse(await lineReader(child)()) as {
      flushed: number;
      recorded: number;
      open: number;
    };
    child.kill("SIGKILL");
    expect((await exited(child)).signal).toBe("SIGKILL");
    const lease = 100_000 * DEFAULT_LEASE_SETTINGS.share;
    expect(await admin.usage(id)).toMatchObject({
      spentTokens: state.flushed,
      leasedTokens: lease - state.flushed,
    });
    expect(await admin.reclaimStale()).toEqual({ holds: 0, leases: 0 }); // not expired yet
    const later = await open({ leases: false, now: () => Date.now() + 3_600_000 + 1000 }); // the child's lease TTL
    expect(await later.reclaimStale()).toEqual({ holds: 0, leases: 1 });
    expect(await admin.usage(id)).toMatchObject({
      spentTokens: state.flushed + state.recorded, // the unflushed settle (60) is what the crash cost
      leasedTokens: 0,
      leases: 0,
      reclaimedHolds: state.open,
      availableTokens: 100_000 - state.flushed - state.recorded,
    });
    expect(await later.reclaimStale()).toEqual({ holds: 0, leases: 0 }); // nothing twice
  });

  /**
   * A replica with leases (`stalled`) and one without (`other`) on one clock (`clock.ms`, moved by
   * the test), a key with a Budget of 10,000, and a demand of 100 tokens.
   */
  async function stalledPair() {
    const clock = { ms: 1_900_000_000_000 };
    const stalled = await open({
      instanceId: "stalled",
      now: () => clock.ms,
      leases: { drainPollMs: 3_600_000 },
    });
    const other = await open({ instanceId: "other", leases: false, now: () => clock.ms });
    const { id, key } = await other.createKey({ budgetTokens: 10_000 });
    const info = await stalled.authenticate(`Bearer ${key}`);
    const demand = { promptTokens: 0, prompts: 1, n: 1, maxTokens: 100 };
    return { clock, stalled, other, id, key, info, demand };
  }

  it("a lease lost while its replica stalled: later settles charge only what the reclaim did not, capped at what is free", async () => {
    const { clock, stalled, other, id, info, demand } = await stalledPair();
    const renewed = await stalled.placeHold(info, demand);
    const plain = await stalled.placeHold(info, demand);
    await stalled.renew(renewed.holdId, 30);
    clock.ms += DEFAULT_LEASE_SETTINGS.ttlMs + 1;
    expect(await other.reclaimStale()).toEqual({ holds: 0, leases: 1 });
    expect((await other.usage(id)).spentTokens).toBe(30);
    // The stalled replica comes back: its Holds' settles reach a lease that is gone.
    expect((await stalled.settle(renewed.holdId, 80)).chargedTokens).toBe(80);
    expect((await stalled.settle(plain.holdId, 20)).chargedTokens).toBe(20);
    await stalled.syncLeases();
    expect((await other.usage(id)).spentTokens).toBe(30 + 50 + 20); // 80 − 30 already charged, + 20
    const again = await stalled.placeHold(info, demand); // a new lease
    await stalled.settle(again.holdId, 5);
    await stalled.close();
    expect(await other.usage(id)).toMatchObject({ spentTokens: 105, leasedTokens: 0 });
  });

  it("a Hold whose lease lapsed stands only once the store vouches for it: lost, it moves into the store if the Budget holds what it may still use", async () => {
    const { clock, stalled, other, id, key, info, demand } = await stalledPair();
    const moved = await stalled.placeHold(info, demand);
    const refused = await stalled.placeHold(info, demand);
    await stalled.renew(moved.holdId, 30);
    // Renewed within three quarters of its TTL: vouched for without a promise.
    expect(stalled.standing(moved.holdId)).toBe(true);
    clock.ms += DEFAULT_LEASE_SETTINGS.ttlMs + 1; // stalled past the lease's expiry
    expect(await other.reclaimStale()).toEqual({ holds: 0, leases: 1 });
    // The reclaim charged the renewal (30) and freed the rest: another request takes all but 70.
    const meanwhile = await other.placeHold(await other.authenticate(`Bearer ${key}`), {
      promptTokens: 0,
      prompts: 1,
      n: 1,
      maxTokens: 9900,
    });
    expect(meanwhile).toMatchObject({ heldTokens: 9900, clamped: false });
    // Back: the first Hold may still use 100 − 30 = 70 (exactly what is free): it moves into the store.
    const first = stalled.standing(moved.holdId);
    expect(first).toBeInstanceOf(Promise);
    expect(await first).toBe(true);
    expect(await other.usage(id)).toMatchObject({ spentTokens: 30, heldTokens: 9970, openHolds: 2 });
    expect(stalled.standing(moved.holdId)).toBe(true); // in the store now
    // The second may use 100 and nothing is free: it must deliver nothing more.
    expect(await stalled.standing(refused.holdId)).toBe(false);
    // Settles: the moved Hold charges what the reclaim did not (80 − 30) and frees the rest.
    expect(await stalled.settle(moved.holdId, 80)).toMatchObject({ chargedTokens: 50, releasedTokens: 20 });
    expect(await stalled.settle(moved.holdId, 80)).toMatchObject({
      outcome: "already_settled",
      chargedTokens: 0,
    });
    expect((await stalled.settle(refused.holdId, 10)).chargedTokens).toBe(10); // of the 20 now free
    await other.settle(meanwhile.holdId, 9900);
    expect(await other.usage(id)).toMatchObject({
      spentTokens: 30 + 50 + 10 + 9900,
      heldTokens: 0,
      openHolds: 0,
      leasedTokens: 0,
    });
    await stalled.close();
  });

  it("the store applies a late charge once per Hold id: a retry whose answer was lost charges nothing", async () => {
    const admin = await open({ leases: false });
    const { id } = await admin.createKey({ budgetTokens: 1000 });
    const raw =
      store.kind === "postgres"
        ? await createPostgresBudgetStore({ url: store.acsDb(), poolSize: 1 })
        : createSqliteBudgetStore({ path: store.acsDb() });
    try {
      const late = { holdId: "hold_late", keyId: id, tokens: 40, instanceId: "x", now: 5, day: "2030-01-01" };
      expect(await raw.chargeLate(late)).toBe(40);
      expect(await raw.chargeLate(late)).toBe(0);
      expect(await raw.chargeLate({ ...late, holdId: "hold_late2", tokens: 0 })).toBe(0);
      expect(await admin.usage(id)).toMatchObject({
        spentTokens: 40,
        heldTokens: 0,
        openHolds: 0,
        settledHolds: 2,
      });
    } finally {
      await raw.close();
    }
  });

  it("the store applies a lease step at most once: a retry with the same seq answers as the first time", async () => {
    const admin = await open({ leases: false });
    const { id } = await admin.createKey({ budgetTokens: 1000 });
    const raw =
      store.kind === "postgres"
        ? await createPostgresBudgetStore({ url: store.acsDb(), poolSize: 1 })
        : createSqliteBudgetStore({ path: store.acsDb() });
    try {
      const base: LeaseSyncInput = {
        leaseId: "lease_test",
        keyId: id,
        instanceId: "x",
        seq: 1,
        now: 1,
        day: "2030-01-01",
        expiresAt: 2,
        charge: 0,
        chargeIfLost: 0,
        settled: 0,
        release: 0,
        reclaimCharge: 0,
        holds: 0,
        acknowledgeDrain: false,
        closing: false,
        close: false,
        grow: () => 300,
      };
      const first = await raw.syncLease(base);
      expect(first).toMatchObject({ kind: "synced", granted: 300, tokens: 300 });
      expect(await raw.syncLease(base)).toMatchObject({ kind: "synced", granted: 300, tokens: 300 });
      const step2 = {
        ...base,
        seq: 2,
        charge: 120,
        chargeIfLost: 120,
        settled: 2,
        release: 80,
        grow: undefined,
      };
      const { grow: _, ...step2Input } = step2;
      await raw.syncLease(step2Input);
      await raw.syncLease(step2Input);
      expect(await admin.usage(id)).toMatchObject({ spentTokens: 120, leasedTokens: 100, settledHolds: 2 });
      await expect(raw.syncLease({ ...step2Input, seq: 4 })).rejects.toThrow(/out of order/);
      expect(await raw.reclaimExpired(10, "2030-01-01")).toEqual({ holds: 0, leases: 1 });
      const lost = { ...step2Input, seq: 3, charge: 50, chargeIfLost: 40, settled: 1, release: 0 };
      expect(await raw.syncLease(lost)).toEqual({ kind: "lost", charged: 40 });
      expect(await raw.syncLease(lost)).toEqual({ kind: "lost", charged: 40 });
      expect(await admin.usage(id)).toMatchObject({ spentTokens: 160, leasedTokens: 0, leases: 0 });
    } finally {
      await raw.close();
    }
  });
});
