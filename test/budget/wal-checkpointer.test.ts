// The SQLite store's WAL checkpoints run on a worker thread (src/budget/wal-checkpointer.ts), not in
// the commits of the request path. In WAL mode a commit only appends to the `-wal` file; the
// database file itself changes only when a checkpoint copies pages into it. So a key written while
// the store is open reaches the database file only through a checkpoint: the worker's, since
// SQLite's own (the safety net, at 8,192 pages of WAL) is far from due after a few writes.
import { readFileSync, statSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { until } from "../helpers/hang-guard.js";
import { tempDb } from "./helpers.js";

describe("the SQLite store's WAL checkpointer", () => {
  let db: ReturnType<typeof tempDb>;
  afterEach(() => db.cleanup());

  it("copies committed pages into the database file while the store is open; closes with the store", async () => {
    db = tempDb();
    const ledger = await createBudgetLedger({ path: db.path, reclaimIntervalMs: 0, leases: false });
    const marker = `checkpointed-${process.pid}-${Date.now()}`;
    await ledger.createKey({ name: marker, budgetTokens: 100 });
    // A few hundred frames of WAL, far below the safety net's 8,192 pages.
    expect(statSync(`${db.path}-wal`).size).toBeLessThan(8192 * 4096);
    await until(() => readFileSync(db.path).includes(marker), "the key's page copied into the database file");
    const key = await ledger.createKey({ budgetTokens: 100 });
    for (let i = 0; i < 50; i++) {
      const hold = await ledger.placeHold(
        { id: key.id, name: "", models: null },
        { promptTokens: 1, prompts: 1, n: 1, maxTokens: 1 },
      );
      await ledger.settle(hold.holdId, 1);
    }
    expect((await ledger.usage(key.id)).spentTokens).toBe(50);
    await ledger.close();
  });

  it("is not started with walCheckpoint: automatic (SQLite's own checkpoint, at 1,000 pages)", async () => {
    db = tempDb();
    const ledger = await createBudgetLedger({
      path: db.path,
      reclaimIntervalMs: 0,
      leases: false,
      walCheckpoint: "automatic",
    });
    const marker = `not-checkpointed-${process.pid}-${Date.now()}`;
    await ledger.createKey({ name: marker, budgetTokens: 100 });
    // The worker would have copied it within a few of its 100 ms rounds.
    await new Promise((r) => setTimeout(r, 500));
    expect(readFileSync(db.path).includes(marker)).toBe(false);
    await ledger.close();
  });
});
