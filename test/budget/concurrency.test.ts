// Several processes on one store never overspend a Budget, whatever the interleaving: 10 real
// processes on one SQLite file (one transaction per Hold), and 10 replicas on one PostgreSQL
// database (leases), against a Budget that fits 100 requests.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { exited, lineReader, spawnFixture, storesUnderTest } from "./helpers.js";

interface WorkerResult {
  cycles: {
    holdId: string;
    heldTokens: number;
    maxTokens: number;
    clamped: boolean;
    usedTokens: number;
    chargedTokens: number;
    outcome: string;
    secondOutcome: string;
    secondCharged: number;
  }[];
  refusals: string[];
  maxInFlight: number;
}

const PROCESSES = 10;
const CYCLES_EACH = 50; // 500 in all
const PER_REQUEST = 100; // 10 prompt tokens + 1 × 1 × 90
const BUDGET = 100 * PER_REQUEST; // fits 100 of them

describe.each(storesUnderTest("concurrency"))(
  "500 simultaneous hold/settle cycles from 10 processes on $kind",
  (store) => {
    const leaseMode = store.kind === "postgres" ? "leases" : "per-hold";
    let ledger: BudgetLedger | undefined;
    beforeAll(() => store.setup());
    afterAll(() => store.teardown());
    beforeEach((ctx) => store.fresh(ctx));
    afterEach(async () => {
      await ledger?.close();
      ledger = undefined;
      store.cleanup();
    });

    /**
     * Runs 500 hold/settle cycles from 10 real processes on one store, against a Budget that fits
     * 100 of them, sampling the Budget from this process the whole time.
     */
    async function runCycles(usage: "full" | "random") {
      ledger = await createBudgetLedger({ ...store.options(), reclaimIntervalMs: 0, leases: false });
      const admin = ledger;
      const { id, key } = await admin.createKey({ name: "load", budgetTokens: BUDGET });
      const children = Array.from({ length: PROCESSES }, (_, i) =>
        spawnFixture("hold-worker.ts", [
          store.acsDb(),
          key,
          String(CYCLES_EACH),
          usage,
          String(i + 1),
          leaseMode,
        ]),
      );
      const readers = children.map(lineReader);
      for (const read of readers) expect(await read()).toBe("ready");

      // Sample committed state while the workers run: spent + held + leased never above the Budget.
      let samples = 0;
      let worst = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          const u = await admin.usage(id);
          samples++;
          worst = Math.max(worst, u.spentTokens + u.heldTokens + u.leasedTokens);
          await new Promise((r) => setTimeout(r, 1));
        }
      })();
      let results: WorkerResult[];
      try {
        for (const child of children) child.stdin?.write("go\n");
        results = (await Promise.all(readers.map((read) => read()))).map(
          (l) => JSON.parse(l) as WorkerResult,
        );
      } catch (err) {
        for (const child of children) if (child.exitCode === null) child.kill("SIGKILL");
        throw err;
      } finally {
        sampling = false;
        await sampler;
      }
      for (const child of children) expect((await exited(child)).code).toBe(0);
      return { results, samples, worst, final: await admin.usage(id) };
    }

    it(`holds exactly the 100 that fit when every request uses its whole Hold; 429 for the rest (${leaseMode})`, async () => {
      const { results, samples, worst, final } = await runCycles("full");
      const cycles = results.flatMap((r) => r.cycles);
      const refusals = results.flatMap((r) => r.refusals);

      expect(cycles).toHaveLength(100);
      expect(refusals).toHaveLength(400);
      expect(new Set(refusals)).toEqual(new Set(["insufficient_quota"]));
      expect(cycles.every((c) => !c.clamped && c.heldTokens === PER_REQUEST)).toBe(true);
      expect(new Set(cycles.map((c) => c.holdId)).size).toBe(100);

      // Exactly once: every first settle charged, every second one was a no-op.
      expect(cycles.every((c) => c.outcome === "settled" && c.secondOutcome === "already_settled")).toBe(
        true,
      );
      expect(cycles.every((c) => c.secondCharged === 0)).toBe(true);

      expect(final).toMatchObject({
        spentTokens: BUDGET,
        heldTokens: 0,
        leasedTokens: 0,
        openHolds: 0,
        leases: 0,
        settledHolds: 100,
      });
      expect(samples).toBeGreaterThan(0);
      expect(worst).toBeLessThanOrEqual(BUDGET);
      expect(Math.max(...results.map((r) => r.maxInFlight))).toBeGreaterThan(1); // Holds really overlapped
    });

    it(`with partial usage: never over the Budget, every Hold settled once, Σ charges = Σ used = spent (${leaseMode})`, async () => {
      const { results, samples, worst, final } = await runCycles("random");
      const cycles = results.flatMap((r) => r.cycles);
      const refusals = results.flatMap((r) => r.refusals);

      expect(cycles.length + refusals.length).toBe(500);
      expect(cycles.length).toBeGreaterThanOrEqual(100); // released tokens let more in
      expect([...new Set(refusals)]).toEqual(refusals.length > 0 ? ["insufficient_quota"] : []);

      for (const c of cycles) {
        expect(c.heldTokens).toBe(10 + c.maxTokens);
        expect(c.clamped).toBe(c.maxTokens < 90);
        expect(c.maxTokens).toBeGreaterThanOrEqual(1);
        expect(c.outcome).toBe("settled");
        expect(c.chargedTokens).toBe(c.usedTokens);
        expect(c.secondOutcome).toBe("already_settled");
        expect(c.secondCharged).toBe(0);
      }
      const sumUsed = cycles.reduce((s, c) => s + c.usedTokens, 0);
      const sumCharged = cycles.reduce((s, c) => s + c.chargedTokens, 0);
      expect(sumCharged).toBe(sumUsed);
      expect(final.spentTokens).toBe(sumUsed);
      expect(final.spentTokens).toBeLessThanOrEqual(BUDGET);
      expect(final).toMatchObject({
        openHolds: 0,
        heldTokens: 0,
        leasedTokens: 0,
        settledHolds: cycles.length,
      });
      expect(final.daily.reduce((s, d) => s + d.chargedTokens, 0)).toBe(sumUsed);
      expect(samples).toBeGreaterThan(0);
      expect(worst).toBeLessThanOrEqual(BUDGET);
      expect(Math.max(...results.map((r) => r.maxInFlight))).toBeGreaterThan(1);
    });
  },
);
