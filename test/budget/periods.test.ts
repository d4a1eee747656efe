// Budget periods (src/budget/README.md "Budget periods"): the boundaries (a pure table), and on
// both stores with a clock the test controls, a reset while requests run — Holds placed before
// the boundary settle (or are reclaimed) to their period, no period is charged past its Budget,
// and every charge counts in exactly one period. With leases, two ledgers on one PostgreSQL.
import { describe, expect, it } from "vitest";
import {
  type BudgetLedger,
  type BudgetPeriod,
  type KeyInfo,
  nextBoundary,
  periodStart,
} from "../../src/budget/index.js";
import { clockedLedgers, storesUnderTest } from "./helpers.js";

const utc = (text: string): number => Date.parse(`${text}Z`);

describe("period boundaries (UTC)", () => {
  // [period, now, its period's start, the next boundary]
  const table: [BudgetPeriod, string, string, string][] = [
    ["day", "2030-01-31T23:59:59.999", "2030-01-31T00:00:00", "2030-02-01T00:00:00"],
    ["day", "2030-02-01T00:00:00", "2030-02-01T00:00:00", "2030-02-02T00:00:00"],
    ["day", "2028-02-28T12:00:00", "2028-02-28T00:00:00", "2028-02-29T00:00:00"],
    ["day", "2030-12-31T18:00:00", "2030-12-31T00:00:00", "2031-01-01T00:00:00"],
    ["month", "2030-01-15T10:00:00", "2030-01-01T00:00:00", "2030-02-01T00:00:00"],
    ["month", "2030-02-28T23:59:59.999", "2030-02-01T00:00:00", "2030-03-01T00:00:00"],
    ["month", "2028-02-29T23:00:00", "2028-02-01T00:00:00", "2028-03-01T00:00:00"], // leap year
    ["month", "2100-02-15T00:00:00", "2100-02-01T00:00:00", "2100-03-01T00:00:00"], // not a leap year
    ["month", "2030-04-30T23:59:59.999", "2030-04-01T00:00:00", "2030-05-01T00:00:00"],
    ["month", "2030-12-31T23:59:59.999", "2030-12-01T00:00:00", "2031-01-01T00:00:00"], // year end
    ["month", "2031-01-01T00:00:00", "2031-01-01T00:00:00", "2031-02-01T00:00:00"],
    ["week", "2030-01-02T09:00:00", "2029-12-31T00:00:00", "2030-01-07T00:00:00"], // Wednesday, week across years
    ["week", "2030-01-06T23:59:59.999", "2029-12-31T00:00:00", "2030-01-07T00:00:00"], // Sunday: still that week
    ["week", "2030-01-07T00:00:00", "2030-01-07T00:00:00", "2030-01-14T00:00:00"], // Monday 00:00
    ["week", "2027-01-01T12:00:00", "2026-12-28T00:00:00", "2027-01-04T00:00:00"], // ISO week 53 of 2026
    ["week", "2028-02-29T12:00:00", "2028-02-28T00:00:00", "2028-03-06T00:00:00"],
    ["week", "1970-01-01T00:00:00", "1969-12-29T00:00:00", "1970-01-05T00:00:00"], // before the epoch's Monday
  ];
  it.each(table)("%s of %s starts at %s and ends at %s", (period, now, start, end) => {
    expect(periodStart(period, utc(now))).toBe(utc(start));
    expect(nextBoundary(period, utc(start))).toBe(utc(end));
    // The next period starts where this one ends.
    expect(periodStart(period, utc(end))).toBe(utc(end));
    expect(periodStart(period, utc(end) - 1)).toBe(utc(start));
  });
  it("`none` is one period that never ends", () => {
    expect(periodStart("none", utc("2030-05-05T05:05:05"))).toBe(0);
    expect(nextBoundary("none", 0)).toBe(0);
  });
});

const BOUNDARY = utc("2030-02-01T00:00:00");
const JANUARY = utc("2030-01-01T00:00:00");
const PER_HOLD = 50; // 10 prompt tokens + 40 generated at most
const BUDGET = 40 * PER_HOLD; // a month fits 40 Holds whole
const demand = { promptTokens: 10, prompts: 1, n: 1, maxTokens: 40 };
/** What the i-th request uses (prompt + generated), deterministic, ≤ its Hold. */
const usedBy = (i: number): number => 10 + ((i * 7) % 41);

/** Places one Hold per index, at once; the refused ones (429) are undefined. */
async function placeAll(ledger: BudgetLedger, info: KeyInfo, n: number) {
  return Promise.all(
    Array.from({ length: n }, () =>
      ledger.placeHold(info, demand).then(
        (h) => h,
        (err: { code?: string }) => {
          if (err.code !== "insufficient_quota") throw err;
          return undefined;
        },
      ),
    ),
  );
}

describe.each(storesUnderTest("budget_periods"))("a month's Budget across its boundary on $kind", (store) => {
  const { clock, open } = clockedLedgers(store, { leases: false });

  it("100 concurrent Holds straddling the boundary: each period charged its own Holds' usage, none over its Budget, nothing lost", async () => {
    clock.now = BOUNDARY - 60_000;
    const ledger = await open();
    const { id, key } = await ledger.createKey({ name: "monthly", budgetTokens: BUDGET, period: "month" });
    const info = await ledger.authenticate(`Bearer ${key}`);
    expect(await ledger.usage(id)).toMatchObject({
      period: "month",
      periodStart: JANUARY,
      resetsAt: BOUNDARY,
      periods: [],
    });
    // January: 60 asked at once, 40 fit whole, the rest is refused (or clamped to nothing).
    const before = (await placeAll(ledger, info, 60)).filter((h) => h !== undefined);
    expect(before.reduce((s, h) => s + h.heldTokens, 0)).toBeLessThanOrEqual(BUDGET);
    const whole = before.filter((h) => !h.clamped);
    expect(whole.length).toBe(40);
    const charged = (results: { chargedTokens: number }[]) =>
      results.reduce((s, r) => s + r.chargedTokens, 0);
    // Half of them settle in January.
    let january = charged(
      await Promise.all(before.slice(0, 20).map((h, i) => ledger.settle(h.holdId, usedBy(i)))),
    );
    // The boundary: no transaction yet, the ledger already shows the new period.
    clock.now = BOUNDARY + 1_000;
    const quiet = await ledger.usage(id);
    expect(quiet).toMatchObject({ spentTokens: 0, heldTokens: 0, periodStart: BOUNDARY });
    expect(quiet.periods?.[0]).toMatchObject({ periodStart: JANUARY, spentTokens: january });
    // February: 40 new Holds fit whole although January's other 20 are still open (their tokens
    // are January's), while those 20 settle at the same time.
    const [after, late] = await Promise.all([
      placeAll(ledger, info, 40),
      Promise.all(before.slice(20).map((h, i) => ledger.settle(h.holdId, usedBy(20 + i)))),
    ]);
    january += charged(late);
    expect(after.every((h) => h !== undefined && !h.clamped)).toBe(true);
    const february = charged(
      await Promise.all(after.map((h, i) => ledger.settle(h?.holdId ?? "", usedBy(100 + i)))),
    );
    const expectedJanuary = before.reduce((s, h, i) => s + Math.min(usedBy(i), h.heldTokens), 0);
    const expectedFebruary = after.reduce((s, _h, i) => s + usedBy(100 + i), 0);
    expect(january).toBe(expectedJanuary);
    expect(february).toBe(expectedFebruary);
    const u = await ledger.usage(id);
    expect(u).toMatchObject({ spentTokens: february, heldTokens: 0, periodStart: BOUNDARY });
    expect(u.resetsAt).toBe(utc("2030-03-01T00:00:00"));
    expect(u.periods).toEqual([
      {
        periodStart: JANUARY,
        periodEnd: BOUNDARY,
        budgetTokens: BUDGET,
        spentTokens: expectedJanuary,
        heldTokens: 0,
        leasedTokens: 0,
      },
    ]);
    expect(expectedJanuary).toBeLessThanOrEqual(BUDGET);
    expect(expectedFebruary).toBeLessThanOrEqual(BUDGET);
    // Nothing lost: the days' charges are the periods' sum.
    expect(u.daily.reduce((s, d) => s + d.chargedTokens, 0)).toBe(expectedJanuary + expectedFebruary);
  });

  it("a reclaimed January Hold charges January, and its late settle January's free tokens at most", async () => {
    clock.now = BOUNDARY - 60_000;
    const ledger = await open({ holdTtlMs: 120_000 });
    const { id, key } = await ledger.createKey({ budgetTokens: 100, period: "month" });
    const info = await ledger.authenticate(`Bearer ${key}`);
    const a = await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 50 });
    const b = await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 30 });
    expect(await ledger.renew(a.holdId, 30)).toBe(true);
    await ledger.settle(b.holdId, 25);
    clock.now = BOUNDARY + 120_000; // past the boundary and a's expiry
    expect(await ledger.reclaimStale()).toEqual({ holds: 1, leases: 0 });
    let u = await ledger.usage(id);
    expect(u.spentTokens).toBe(0);
    expect(u.periods?.[0]).toMatchObject({ periodStart: JANUARY, spentTokens: 55, heldTokens: 0 });
    // February's whole Budget is free; a's settle after its reclaim charges January's rest.
    const c = await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 90 });
    expect(c).toMatchObject({ heldTokens: 100, clamped: false });
    expect(await ledger.settle(a.holdId, 60)).toEqual({
      outcome: "settled_after_reclaim",
      chargedTokens: 30,
      releasedTokens: 0,
    });
    await ledger.settle(c.holdId, 100);
    u = await ledger.usage(id);
    expect(u.spentTokens).toBe(100);
    expect(u.periods?.[0]).toMatchObject({ spentTokens: 85, heldTokens: 0 });
  });

  it("a key without a period (`none`) never resets", async () => {
    clock.now = BOUNDARY - 60_000;
    const ledger = await open();
    const { id, key } = await ledger.createKey({ budgetTokens: 100 });
    const info = await ledger.authenticate(`Bearer ${key}`);
    await ledger.settle((await ledger.placeHold(info, { ...demand, maxTokens: 50 })).holdId, 60);
    clock.now = BOUNDARY + 86_400_000 * 40;
    await expect(ledger.placeHold(info, { ...demand, maxTokens: 40 })).resolves.toMatchObject({
      clamped: true,
      maxTokens: 30,
    });
    const u = await ledger.usage(id);
    expect(u.spentTokens).toBe(60);
    expect(u).not.toHaveProperty("period");
    expect(u).not.toHaveProperty("periods");
  });
});

describe.each(storesUnderTest("budget_periods_leases").filter((s) => s.kind === "postgres"))(
  "two replicas with leases across a month's boundary on $kind",
  (store) => {
    const { clock, open } = clockedLedgers(store, {});

    it("each period charged exactly the usage of the Holds placed in it, on both replicas", async () => {
      // Within a lease's life: the leases taken in January are still live after the boundary.
      clock.now = BOUNDARY - 2_000;
      const a = await open({ instanceId: "gw-a" });
      const b = await open({ instanceId: "gw-b" });
      expect(a.leased && b.leased).toBe(true);
      const { id, key } = await a.createKey({ budgetTokens: 1_000_000, period: "month" });
      const ia = await a.authenticate(`Bearer ${key}`);
      const ib = await b.authenticate(`Bearer ${key}`);
      const expected = { january: 0, february: 0 };
      const round = async (n: number, offset: number) => {
        const holds = [...(await placeAll(a, ia, n)), ...(await placeAll(b, ib, n))];
        expect(holds.every((h) => h !== undefined)).toBe(true);
        return holds.map((h, i) => ({
          ledger: i < n ? a : b,
          holdId: h?.holdId ?? "",
          used: usedBy(offset + i),
        }));
      };
      const settleAll = (holds: Awaited<ReturnType<typeof round>>) =>
        Promise.all(holds.map((h) => h.ledger.settle(h.holdId, h.used)));
      const sum = (holds: Awaited<ReturnType<typeof round>>) => holds.reduce((s, h) => s + h.used, 0);
      const january = await round(30, 0);
      await settleAll(january.slice(0, 30));
      expect((await a.usage(id)).leases).toBe(2); // both replicas serve the key from a lease
      clock.now = BOUNDARY;
      // February's Holds go on new leases; January's other half settles meanwhile, to January.
      const [february] = await Promise.all([round(30, 100), settleAll(january.slice(30))]);
      await settleAll(february);
      expected.january = sum(january);
      expected.february = sum(february);
      for (let i = 0; i < 3; i++) await Promise.all([a.syncLeases(), b.syncLeases()]);
      const u = await a.usage(id);
      expect(u.periods?.[0]).toMatchObject({
        periodStart: JANUARY,
        spentTokens: expected.january,
        heldTokens: 0,
        leasedTokens: 0, // January's leases ended with their last Hold
      });
      expect(u.spentTokens).toBe(expected.february);
      expect(u.daily.reduce((s, d) => s + d.chargedTokens, 0)).toBe(expected.january + expected.february);
    });
  },
);
