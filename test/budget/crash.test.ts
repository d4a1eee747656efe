// A process killed with SIGKILL while its Holds (one transaction each) are open, on both stores:
// its Holds are reclaimed at the next start or after their expiry, charged what their renewals
// recorded, and nothing is charged twice.
import Database from "better-sqlite3";
import pg from "pg";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { until } from "../helpers/hang-guard.js";
import { exited, lineReader, spawnFixture, storesUnderTest } from "./helpers.js";

describe.each(storesUnderTest("crash"))(
  "a gateway killed with SIGKILL while Holds are open, on $kind",
  (store) => {
    const open = (extra: Record<string, unknown> = {}) =>
      createBudgetLedger({ ...store.options(), reclaimIntervalMs: 0, leases: false, ...extra });
    beforeAll(() => store.setup());
    afterAll(() => store.teardown());
    beforeEach((ctx) => store.fresh(ctx));
    afterEach(() => store.cleanup());

    it("leaves its Holds to be reclaimed on the next start, charged what their renewals recorded; nothing twice", async () => {
      const admin = await open();
      const { id, key } = await admin.createKey({ budgetTokens: 10_000 });
      await admin.close();

      // 12 Holds of 100: 5 settled at 40, 3 renewed recording 15 used, 4 never renewed.
      const child = spawnFixture("crash-child.ts", [store.acsDb(), key, "12", "5", "3"]);
      const { settled } = JSON.parse(await lineReader(child)()) as { holdIds: string[]; settled: string[] };
      child.kill("SIGKILL");
      expect((await exited(child)).signal).toBe("SIGKILL");

      const restarted = await open();
      try {
        expect(await restarted.usage(id)).toMatchObject({
          spentTokens: 200,
          heldTokens: 700,
          openHolds: 7,
          settledHolds: 5,
        });
        expect(await restarted.reclaimOnStart()).toEqual({ holds: 7, leases: 0 });
        expect(await restarted.usage(id)).toMatchObject({
          spentTokens: 200 + 3 * 15,
          heldTokens: 0,
          openHolds: 0,
          availableTokens: 10_000 - 245,
          settledHolds: 5,
          reclaimedHolds: 7,
        });
        expect(await restarted.reclaimOnStart()).toEqual({ holds: 0, leases: 0 });
        expect(await restarted.reclaimStale()).toEqual({ holds: 0, leases: 0 });

        // Settles repeated after the restart (a retry of the dead process's work) charge nothing.
        for (const holdId of settled)
          expect((await restarted.settle(holdId, 40)).outcome).toBe("already_settled");
        expect((await restarted.usage(id)).spentTokens).toBe(245);
        // The whole Budget but the tokens spent can be held again.
        const info = await restarted.authenticate(`Bearer ${key}`);
        const again = await restarted.placeHold(info, {
          promptTokens: 0,
          prompts: 1,
          n: 1,
          maxTokens: 10_000 - 245,
        });
        expect(again.clamped).toBe(false);
      } finally {
        await restarted.close();
      }
    });

    it("reclaims the dead process's Holds by expiry when no one restarts it (reclaimStale)", async () => {
      const admin = await open();
      try {
        const { id, key } = await admin.createKey({ budgetTokens: 1_000 });
        const child = spawnFixture("crash-child.ts", [store.acsDb(), key, "3", "0", "1"]);
        await lineReader(child)();
        child.kill("SIGKILL");
        await exited(child);
        expect(await admin.reclaimStale()).toEqual({ holds: 0, leases: 0 }); // not yet expired
        const later = await open({ now: () => Date.now() + 16 * 60_000 });
        expect(await later.reclaimStale()).toEqual({ holds: 3, leases: 0 });
        await later.close();
        expect(await admin.usage(id)).toMatchObject({ spentTokens: 15, heldTokens: 0, reclaimedHolds: 3 });
      } finally {
        await admin.close();
      }
    });

    it("killed in the middle of a stream of writes, leaves a consistent ledger: spent = Σ charges", async () => {
      const admin = await open();
      const { id, key } = await admin.createKey({ budgetTokens: 1_000_000_000 });
      const child = spawnFixture("churn-child.ts", [store.acsDb(), key]);
      expect(await lineReader(child)()).toBe("running");
      // kill it once it has settled a few Holds (counted in the store, not waited for by the clock)
      await until(async () => (await admin.usage(id)).settledHolds > 10, "the child settled Holds", 5);
      await admin.close();
      child.kill("SIGKILL");
      expect((await exited(child)).signal).toBe("SIGKILL");

      const restarted = await open();
      try {
        const before = await restarted.usage(id);
        expect(before.settledHolds).toBeGreaterThan(3);
        expect(before.openHolds).toBeGreaterThanOrEqual(1);
        expect(before.openHolds).toBeLessThanOrEqual(2);
        expect(before.spentTokens).toBe(37 * before.settledHolds);
        expect(await restarted.reclaimOnStart()).toEqual({ holds: before.openHolds, leases: 0 });
        const after = await restarted.usage(id);
        expect(after).toMatchObject({ spentTokens: before.spentTokens, heldTokens: 0, openHolds: 0 });
        expect(after.daily.reduce((s, d) => s + d.chargedTokens, 0)).toBe(after.spentTokens);
      } finally {
        await restarted.close();
      }

      // Σ of the Holds' charges (none purged yet) is what the key was charged.
      const sql = "SELECT coalesce(sum(charged_tokens), 0) AS charged FROM holds WHERE key_id = $1";
      let charged: number;
      if (store.kind === "sqlite") {
        const raw = new Database(store.acsDb(), { readonly: true });
        expect(raw.pragma("integrity_check", { simple: true })).toBe("ok");
        charged = (raw.prepare(sql.replace("$1", "?")).get(id) as { charged: number }).charged;
        raw.close();
      } else {
        const client = new pg.Client({ connectionString: store.acsDb() });
        await client.connect();
        charged = Number((await client.query(sql, [id])).rows[0]?.charged);
        await client.end();
      }
      const check = await open();
      expect(charged).toBe((await check.usage(id)).spentTokens);
      await check.close();
    });
  },
);
