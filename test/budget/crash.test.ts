import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { until } from "../helpers/hang-guard.js";
import { exited, lineReader, spawnFixture, tempDb } from "./helpers.js";

let cleanup: (() => void) | undefined;
afterEach(() => {
  cleanup?.();
  cleanup = undefined;
});

describe("a gateway killed with SIGKILL while Holds are open", () => {
  it("leaves its Holds to be reclaimed on the next start; nothing is charged twice", async () => {
    const db = tempDb();
    cleanup = db.cleanup;
    const admin = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
    const { id, key } = admin.createKey({ budgetTokens: 10_000 });
    admin.close();

    const child = spawnFixture("crash-child.ts", [db.path, key, "12", "5"]);
    const { holdIds, settled } = JSON.parse(await lineReader(child)()) as {
      holdIds: string[];
      settled: string[];
    };
    expect(holdIds).toHaveLength(12);
    child.kill("SIGKILL");
    expect((await exited(child)).signal).toBe("SIGKILL");

    // What the crash left: 5 settled at 40 tokens, 7 open Holds of 20 + 2 × 40 = 100 tokens.
    const restarted = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
    expect(restarted.usage(id)).toMatchObject({
      spentTokens: 200,
      heldTokens: 700,
      openHolds: 7,
      settledHolds: 5,
    });

    expect(restarted.reclaimOnStart()).toBe(7);
    expect(restarted.usage(id)).toMatchObject({
      spentTokens: 200,
      heldTokens: 0,
      openHolds: 0,
      availableTokens: 9_800,
      settledHolds: 5,
      reclaimedHolds: 7,
    });
    expect(restarted.reclaimOnStart()).toBe(0);
    expect(restarted.reclaimStale()).toBe(0);

    // Settles repeated after the restart (a retry of the dead process's work) charge nothing.
    for (const holdId of settled) expect(restarted.settle(holdId, 40).outcome).toBe("already_settled");
    expect(restarted.usage(id).spentTokens).toBe(200);
    // The whole Budget but the 200 tokens spent can be held again.
    const info = restarted.authenticate(`Bearer ${key}`);
    expect(restarted.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 9_800 }).clamped).toBe(
      false,
    );
    restarted.close();
  });

  it("reclaims the dead process's Holds by expiry when no one restarts it (reclaimStale)", async () => {
    const db = tempDb();
    cleanup = db.cleanup;
    const admin = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
    const { id, key } = admin.createKey({ budgetTokens: 1_000 });
    const child = spawnFixture("crash-child.ts", [db.path, key, "3", "0"]);
    await lineReader(child)();
    child.kill("SIGKILL");
    await exited(child);
    expect(admin.reclaimStale()).toBe(0); // not yet expired
    const later = createBudgetLedger({
      path: db.path,
      reclaimIntervalMs: 0,
      now: () => Date.now() + 16 * 60_000,
    });
    expect(later.reclaimStale()).toBe(3);
    expect(admin.usage(id)).toMatchObject({ spentTokens: 0, heldTokens: 0, reclaimedHolds: 3 });
    later.close();
    admin.close();
  });

  it("killed in the middle of a stream of writes, leaves a consistent ledger: spent = Σ charges", async () => {
    const db = tempDb();
    cleanup = db.cleanup;
    const admin = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
    const { id, key } = admin.createKey({ budgetTokens: 1_000_000_000 });
    const child = spawnFixture("churn-child.ts", [db.path, key]);
    expect(await lineReader(child)()).toBe("running");
    // kill it once it has settled a few Holds (counted in the file, not waited for by the clock)
    await until(() => admin.usage(id).settledHolds > 10, "the child settled Holds", 5);
    admin.close();
    child.kill("SIGKILL");
    expect((await exited(child)).signal).toBe("SIGKILL");

    const restarted = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
    const before = restarted.usage(id);
    expect(before.settledHolds).toBeGreaterThan(10);
    expect(before.openHolds).toBeGreaterThanOrEqual(1);
    expect(before.openHolds).toBeLessThanOrEqual(2);
    expect(before.spentTokens).toBe(37 * before.settledHolds);
    expect(restarted.reclaimOnStart()).toBe(before.openHolds);
    const after = restarted.usage(id);
    expect(after).toMatchObject({ spentTokens: before.spentTokens, heldTokens: 0, openHolds: 0 });
    restarted.close();

    const raw = new Database(db.path, { readonly: true });
    expect(raw.pragma("integrity_check", { simple: true })).toBe("ok");
    const sum = raw
      .prepare("SELECT coalesce(sum(charged_tokens), 0) AS charged FROM holds WHERE key_id = ?")
      .get(id) as { charged: number };
    raw.close();
    expect(sum.charged).toBe(after.spentTokens);
  });
});
