// A SQLite file written by schema version 1 (one table of keys, Holds kept forever) opens with
// this code: migrated in place to the current schema, its numbers intact, its settled Holds
// summed per day.
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { BUDGET_SCHEMA_VERSION, createBudgetLedger, hashApiKey } from "../../src/budget/index.js";
import { tempDb } from "./helpers.js";

const V1 = `
  CREATE TABLE keys (
    id TEXT PRIMARY KEY, key_hash BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32), hint TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '', budget_tokens INTEGER NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens INTEGER NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0 AND spent_tokens <= budget_tokens),
    models TEXT CHECK (models IS NULL OR json_valid(models)), created_at INTEGER NOT NULL, revoked_at INTEGER
  ) STRICT;
  CREATE TABLE holds (
    id TEXT PRIMARY KEY, key_id TEXT NOT NULL REFERENCES keys(id), tokens INTEGER NOT NULL CHECK (tokens > 0),
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, instance_id TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'settled', 'reclaimed')),
    used_tokens INTEGER CHECK (used_tokens IS NULL OR used_tokens >= 0),
    charged_tokens INTEGER NOT NULL DEFAULT 0 CHECK (charged_tokens >= 0 AND charged_tokens <= tokens),
    closed_at INTEGER
  ) STRICT;
  PRAGMA user_version = 1;
`;

let db: ReturnType<typeof tempDb> | undefined;
afterEach(() => db?.cleanup());

describe("SQLite schema migration 1 → current", () => {
  it("keeps keys, spent and open Holds; sums the closed Holds per day; the key still works", async () => {
    db = tempDb();
    const key = "acs-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    const day1 = Date.UTC(2026, 0, 1, 12);
    const day2 = Date.UTC(2026, 0, 2, 12);
    const raw = new Database(db.path);
    raw.exec(V1);
    raw
      .prepare("INSERT INTO keys VALUES ('key_000000000001', ?, 'acs-…AAAA', 'old', 1000, 70, NULL, ?, NULL)")
      .run(hashApiKey(key), day1);
    const hold = raw.prepare("INSERT INTO holds VALUES (?, 'key_000000000001', ?, ?, ?, 'x', ?, ?, ?, ?)");
    hold.run("hold_a", 50, day1, day1, "settled", 30, 30, day1);
    hold.run("hold_b", 50, day2, day2, "settled", 40, 40, day2);
    hold.run("hold_c", 50, day2, day2, "reclaimed", null, 0, day2);
    hold.run("hold_d", 200, day2, day2 + 60_000, "open", null, 0, null);
    raw.close();

    const ledger = await createBudgetLedger({ path: db.path, reclaimIntervalMs: 0, now: () => day2 });
    try {
      const usage = await ledger.usage("key_000000000001");
      expect(usage).toMatchObject({
        budgetTokens: 1000,
        spentTokens: 70,
        heldTokens: 200,
        openHolds: 1,
        leasedTokens: 0,
        availableTokens: 730,
        settledHolds: 2,
        reclaimedHolds: 1,
      });
      expect(usage.daily).toEqual([
        { day: "2026-01-02", chargedTokens: 40, settledHolds: 1, reclaimedHolds: 1 },
        { day: "2026-01-01", chargedTokens: 30, settledHolds: 1, reclaimedHolds: 0 },
      ]);
      expect((await ledger.authenticate(`Bearer ${key}`)).id).toBe("key_000000000001");
      expect(await ledger.settle("hold_d", 120)).toMatchObject({ outcome: "settled", chargedTokens: 120 });
      expect(await ledger.usage("key_000000000001")).toMatchObject({ spentTokens: 190, heldTokens: 0 });
    } finally {
      await ledger.close();
    }
    const check = new Database(db.path, { readonly: true });
    expect(check.pragma("user_version", { simple: true })).toBe(BUDGET_SCHEMA_VERSION);
    expect(check.pragma("foreign_key_check")).toEqual([]);
    check.close();
  });
});
