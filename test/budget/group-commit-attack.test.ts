// Group commit of the SQLite store (src/budget/stores/sqlite/group-commit.ts) under attack, on real files
// and real processes: a SIGKILL while groups are in flight, a turn that mixes failing transactions
// with good ones, and a group that waits for another connection's write lock past the busy timeout.
import { createInterface } from "node:readline";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { createSqliteBudgetStore } from "../../src/budget/stores/sqlite/index.js";
import { until } from "../helpers/hang-guard.js";
import { exited, spawnFixture, tempDb } from "./helpers.js";

interface HoldSql {
  id: string;
  tokens: number;
  state: string;
  used_tokens: number | null;
  charged_tokens: number;
}

describe("SQLite group commit under attack", () => {
  let tmp: ReturnType<typeof tempDb> | undefined;
  afterEach(() => {
    tmp?.cleanup();
    tmp = undefined;
  });

  it("two processes killed with SIGKILL while their groups are in flight: every answer they gave is committed, nothing is charged twice, and the reclaim gives back the open Holds", async () => {
    tmp = tempDb();
    const { path } = tmp;
    const admin = await createBudgetLedger({ path, reclaimIntervalMs: 0, leases: false });
    const { id, key } = await admin.createKey({ budgetTokens: 1_000_000_000 });
    await admin.close();

    const told = {
      held: new Map<string, number>(),
      renewed: new Map<string, number>(),
      settled: new Map<string, { outcome: string; charged: number }>(),
      errors: [] as string[],
    };
    const SETTLES_BEFORE_KILL = 1500;
    const children = ["churn-1", "churn-2"].map((instance) => {
      const child = spawnFixture("group-churn-child.ts", [path, key, "200", instance]);
      let settles = 0;
      const closed = new Promise<void>((resolve) => {
        createInterface({ input: child.stdout! })
          .on("line", (line) => {
            const [kind, a = "", b = "", c = ""] = line.split(" ");
            if (kind === "H") told.held.set(a, Number(b));
            else if (kind === "R") told.renewed.set(a, Number(b));
            else if (kind === "S") {
              told.settled.set(a, { outcome: b, charged: Number(c) });
              // Killed once it has answered enough settles: groups are in flight all the time.
              if (++settles === SETTLES_BEFORE_KILL) child.kill("SIGKILL");
            } else if (kind !== "running") told.errors.push(line);
          })
          .on("close", resolve);
      });
      return { child, closed };
    });
    for (const { child, closed } of children) {
      expect((await exited(child)).signal).toBe("SIGKILL");
      await closed; // every line it wrote before it died
    }
    expect(told.errors).toEqual([]);
    expect(told.settled.size).toBeGreaterThanOrEqual(2 * SETTLES_BEFORE_KILL);

    const db = new Database(path, { readonly: true });
    const holds = new Map(
      db
        .prepare<[], HoldSql>("SELECT id, tokens, state, used_tokens, charged_tokens FROM holds")
        .all()
        .map((h) => [h.id, h]),
    );
    const keyRow = db
      .prepare<[string], { spent_tokens: number; held_tokens: number }>(
        "SELECT spent_tokens, held_tokens FROM keys WHERE id = ?",
      )
      .get(id);
    const daily = db
      .prepare<[string], { charged: number }>(
        "SELECT coalesce(sum(charged_tokens), 0) AS charged FROM usage_daily WHERE key_id = ?",
      )
      .get(id);
    db.close();

    // What each caller was told is committed.
    for (const [holdId, tokens] of told.held) expect(holds.get(holdId)?.tokens, holdId).toBe(tokens);
    for (const [holdId, used] of told.renewed)
      expect(holds.get(holdId)?.used_tokens ?? -1, holdId).toBeGreaterThanOrEqual(used);
    for (const [holdId, { outcome, charged }] of told.settled) {
      expect(outcome).toBe("settled");
      expect(holds.get(holdId), holdId).toMatchObject({ state: "settled", charged_tokens: charged });
    }
    // The key row agrees with its Holds: spent = Σ charges (once each) = Σ per day, held = Σ open.
    const all = [...holds.values()];
    const open = all.filter((h) => h.state === "open");
    const charged = all.reduce((s, h) => s + h.charged_tokens, 0);
    expect(keyRow).toEqual({ spent_tokens: charged, held_tokens: open.reduce((s, h) => s + h.tokens, 0) });
    expect(daily?.charged).toBe(charged);
    expect(open.length).toBeGreaterThan(0); // renewed ones at least

    // A restart releases every open Hold, charging what its renewal recorded.
    const restarted = await createBudgetLedger({ path, reclaimIntervalMs: 0, leases: false });
    try {
      expect(await restarted.reclaimOnStart()).toEqual({ holds: open.length, leases: 0 });
      const recorded = open.reduce((s, h) => s + Math.min(h.used_tokens ?? 0, h.tokens), 0);
      expect(await restarted.usage(id)).toMatchObject({
        spentTokens: charged + recorded,
        heldTokens: 0,
        openHolds: 0,
      });
    } finally {
      await restarted.close();
    }
  });

  it("a turn that mixes transactions failing after a write, failing before one, refused and good ones: the answers and the tables one COMMIT each gives", async () => {
    const day = "2026-12-01";
    const keys = { a: "key_00000000000a", revoked: "key_00000000000b", small: "key_00000000000c" };
    async function run(commit: "group" | "each") {
      const file = tempDb();
      const store = createSqliteBudgetStore({ path: file.path, commit, walCheckpoint: "automatic" });
      try {
        for (const [i, [name, id]] of Object.entries(keys).entries()) {
          await store.insertKey({
            id,
            keyHash: new Uint8Array(32).fill(i + 1),
            hint: name,
            name,
            budgetTokens: name === "small" ? 140 : 1000,
            spentTokens: 0,
            models: null,
            createdAt: 0,
            revokedAt: null,
          });
        }
        await store.revokeKey(keys.revoked, 1);
        const hold = (holdId: string, keyId: string, maxTokens = 90) =>
          store.placeHold({
            holdId,
            keyId,
            instanceId: "i",
            now: 10,
            expiresAt: 100_000,
            demand: { promptTokens: 10, prompts: 1, n: 1, maxTokens },
          });
        await hold("h1", keys.a);
        await store.syncLease({
          leaseId: "l1",
          keyId: keys.a,
          instanceId: "i",
          seq: 1,
          now: 10,
          day,
          expiresAt: 100_000,
          charge: 0,
          settled: 0,
          chargeIfLost: 0,
          release: 0,
          reclaimCharge: 0,
          holds: 0,
          acknowledgeDrain: false,
          closing: false,
          grow: () => 50,
          close: false,
        });
        // All asked in one turn.
        const answers = await Promise.allSettled([
          hold("h2", keys.a), // held
          hold("h2", keys.a), // the same id: its reserve is written, then its INSERT fails
          store.settleHold("unknown", 5, 20, day), // undefined
          hold("h3", keys.revoked), // revoked
          hold("h4", keys.small), // held whole (100 of 140)
          hold("h5", keys.small), // clamped to 10 + 30
          hold("h6", keys.small), // insufficient
          hold("h7", keys.a, 0), // a bad demand: throws before any write
          store.settleHold("h1", 30, 20, day), // settled, 30 charged
          store.settleHold("h1", 30, 20, day), // already settled
          store.settleHold("h4", 500, 20, day), // settled, charged its 100 (capped)
          store.chargeLate({ holdId: "late1", keyId: keys.a, tokens: 7, instanceId: "i", now: 20, day }),
          store.syncLease({
            leaseId: "l1",
            keyId: keys.a,
            instanceId: "i",
            seq: 2,
            now: 20,
            day,
            expiresAt: 100_000,
            charge: 40,
            settled: 1,
            chargeIfLost: 40,
            release: 20, // 40 + 20 > its 50 tokens: throws
            reclaimCharge: 0,
            holds: 0,
            acknowledgeDrain: false,
            closing: false,
            close: false,
          }),
          hold("h8", keys.a), // held, after the failures
        ]);
        await store.close();
        const db = new Database(file.path, { readonly: true });
        const tables = Object.fromEntries(
          ["keys", "holds", "leases", "usage_daily"].map((t) => [
            t,
            db
              .prepare(`SELECT * FROM ${t} ORDER BY 1, 2`)
              .all()
              .map((row) => ({ ...(row as object), key_hash: undefined })),
          ]),
        );
        db.close();
        return {
          answers: answers.map((r) =>
            r.status === "fulfilled" ? (r.value ?? "undefined") : `threw ${(r.reason as Error).message}`,
          ),
          tables,
        };
      } finally {
        file.cleanup();
      }
    }
    const each = await run("each");
    const group = await run("group");
    expect(group).toEqual(each);
    expect(group.answers).toMatchObject([
      { kind: "held", tokens: 100 },
      expect.stringMatching(/^threw UNIQUE constraint failed: holds\.id/),
      "undefined",
      { kind: "revoked" },
      { kind: "held", tokens: 100, clamped: false },
      { kind: "held", tokens: 40, maxTokens: 30, clamped: true },
      { kind: "insufficient" },
      expect.stringMatching(/^threw .*maxTokens/),
      { outcome: "settled", chargedTokens: 30 },
      { outcome: "already_settled" },
      { outcome: "settled", chargedTokens: 100 },
      7,
      expect.stringMatching(/^threw lease l1: charge 40 \+ release 20/),
      { kind: "held", tokens: 100 },
    ]);
    // Key a: h2 and h8 open (the failed duplicate's reserve rolled back), the lease's 50, 37 spent.
    expect(group.tables.keys?.[0]).toMatchObject({
      id: keys.a,
      spent_tokens: 37,
      held_tokens: 200,
      leased_tokens: 50,
    });
  });

  it("a group that waits for another connection's write lock past the busy timeout: its Holds are refused (503), its settles kept and written once the lock is free, each once", async () => {
    tmp = tempDb();
    const { path } = tmp;
    const ledger = await createBudgetLedger({ path, reclaimIntervalMs: 0, leases: false, busyTimeoutMs: 20 });
    const other = new Database(path);
    try {
      const { id } = await ledger.createKey({ budgetTokens: 1000 });
      const key = { id, name: "", models: null };
      const demand = { promptTokens: 10, prompts: 1, n: 1, maxTokens: 90 };
      const placed = await Promise.all([ledger.placeHold(key, demand), ledger.placeHold(key, demand)]);
      other.prepare("BEGIN IMMEDIATE").run();
      // Released only once every answer is in: each of them waited past the busy timeout.
      const answers = await Promise.allSettled([
        ledger.placeHold(key, demand),
        ...placed.map((h) => ledger.settle(h.holdId, 50)),
        ledger.placeHold(key, demand),
      ]);
      expect(
        answers.map((r) =>
          r.status === "rejected"
            ? `${(r.reason as { code?: string }).code} (${((r.reason as Error).cause as { code?: string }).code})`
            : (r.value as { outcome: string }).outcome,
        ),
      ).toEqual([
        "upstream_unavailable (SQLITE_BUSY)",
        "pending",
        "pending",
        "upstream_unavailable (SQLITE_BUSY)",
      ]);
      expect(ledger.writable).toBe(false);
      // The Holds stay open (reserved) while their settles wait.
      expect(await ledger.usage(id)).toMatchObject({ spentTokens: 0, heldTokens: 200, openHolds: 2 });
      other.prepare("COMMIT").run();
      await until(() => ledger.writable, "the pending settles written");
      expect(await ledger.usage(id)).toMatchObject({
        spentTokens: 100,
        heldTokens: 0,
        openHolds: 0,
        settledHolds: 2,
      });
      // Nothing twice: the same settles again change nothing.
      const again = await Promise.all(placed.map((h) => ledger.settle(h.holdId, 50)));
      expect(again.map((s) => s.outcome)).toEqual(["already_settled", "already_settled"]);
      expect(await ledger.usage(id)).toMatchObject({ spentTokens: 100, heldTokens: 0 });
    } finally {
      other.close();
      await ledger.close();
    }
  });
});
