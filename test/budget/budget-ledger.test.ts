// The ledger's contract, one suite run against both stores (SQLite and PostgreSQL), one
// transaction per Hold. Leases have their own suite (leases.test.ts), on both stores too.
import { readFileSync } from "node:fs";
import Database from "better-sqlite3";
import pg from "pg";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  BUDGET_SCHEMA_VERSION,
  type BudgetLedger,
  createBudgetLedger,
  DEFAULT_HOLD_TTL_MS,
  type KeyInfo,
  POSTGRES_BUDGET_SCHEMA_VERSION,
  UnknownIdError,
  utcDay,
} from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { until } from "../helpers/hang-guard.js";
import { type StoreUnderTest, storesUnderTest } from "./helpers.js";

/** Awaits fn and returns the ApiError it throws (fails the test when it throws nothing else). */
async function apiErrorOf(fn: () => unknown): Promise<ApiError> {
  try {
    await fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ApiError);
    return err as ApiError;
  }
  throw new Error("expected an ApiError, nothing was thrown");
}

/** Runs SQL on the store's database directly (what an operator or an attacker would see). */
async function rawQuery(store: StoreUnderTest, sql: string, params: unknown[] = []): Promise<unknown[]> {
  if (store.kind === "sqlite") {
    const raw = new Database((store.options() as { path: string }).path);
    try {
      const s = raw.prepare(sql);
      return s.reader ? s.all(...params) : [s.run(...params)];
    } finally {
      raw.close();
    }
  }
  const client = new pg.Client({ connectionString: store.acsDb() });
  await client.connect();
  try {
    return (
      await client.query(
        sql.replace(/\?/g, (_, i: number) => `$${sql.slice(0, i).split("?").length}`),
        params,
      )
    ).rows;
  } finally {
    await client.end();
  }
}

describe.each(storesUnderTest("ledger"))("the ledger on $kind", (store) => {
  let ledger: BudgetLedger;
  let clock: number;
  const open = (extra: Record<string, unknown> = {}) =>
    createBudgetLedger({
      ...store.options(),
      now: () => clock,
      reclaimIntervalMs: 0,
      leases: false,
      authCacheTtlMs: 0,
      ...extra,
    });

  beforeAll(() => store.setup());
  afterAll(() => store.teardown());
  beforeEach(async (ctx) => {
    await store.fresh(ctx);
    clock = 1_800_000_000_000;
    ledger = await open({ instanceId: "test-a" });
  });
  afterEach(async () => {
    await ledger?.close();
    store.cleanup();
  });

  async function newKey(budgetTokens: number, models?: string[]) {
    const { id, key } = await ledger.createKey({
      name: "t",
      budgetTokens,
      ...(models === undefined ? {} : { models }),
    });
    return { info: (await ledger.authenticate(`Bearer ${key}`)) as KeyInfo, key, id };
  }

  describe("authenticate", () => {
    it("returns the key's id, name, models and hint for a good key, whatever the case of the scheme", async () => {
      const { id, key } = await ledger.createKey({ name: "alice", budgetTokens: 10, models: ["llama-8b"] });
      expect(key).toMatch(/^acs-[A-Za-z0-9_-]{43}$/);
      expect(id).toMatch(/^key_[0-9a-f]{12}$/);
      const hint = `acs-…${key.slice(-4)}`;
      for (const header of [`Bearer ${key}`, `bearer ${key}`, `BEARER ${key}`, `  Bearer   ${key}  `]) {
        expect(await ledger.authenticate(header)).toEqual({ id, name: "alice", models: ["llama-8b"], hint });
      }
    });

    it.each([
      ["missing header", undefined, /^You didn't provide an API key\. .*Authorization: Bearer YOUR_KEY/],
      ["empty header", "", /^You didn't provide an API key\./],
      ["Bearer without a key", "Bearer   ", /^You didn't provide an API key\./],
      ["wrong scheme", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", /^Unsupported authorization scheme\. .*Bearer auth/],
      [
        "a bare key",
        "acs-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        /^Unsupported authorization scheme\./,
      ],
      [
        "unknown key",
        "Bearer acs-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        /^Incorrect API key provided: acs-AAA\*\*\*AAAA\./,
      ],
      ["unknown short junk", "Bearer x", /^Incorrect API key provided\. /],
    ])("%s → 401 invalid_api_key, param null", async (_name, header, message) => {
      await ledger.createKey({ budgetTokens: 10 });
      const err = await apiErrorOf(() => ledger.authenticate(header));
      expect(err.code).toBe("invalid_api_key");
      expect(err.status).toBe(401);
      expect(err.type).toBe("invalid_request_error");
      expect(err.param).toBeNull();
      expect(err.message).toMatch(message);
    });

    it("refuses a revoked key, and only that key", async () => {
      const a = await ledger.createKey({ budgetTokens: 10 });
      const b = await ledger.createKey({ budgetTokens: 10 });
      await ledger.revoke(a.id);
      const err = await apiErrorOf(() => ledger.authenticate(`Bearer ${a.key}`));
      expect(err.code).toBe("invalid_api_key");
      expect(err.status).toBe(401);
      expect(err.message).toMatch(/has been revoked/);
      expect(err.message).not.toContain(a.key);
      expect((await ledger.authenticate(`Bearer ${b.key}`)).id).toBe(b.id);
    });

    it("does not accept a key that differs in one character", async () => {
      const { key } = await ledger.createKey({ budgetTokens: 10 });
      const last = key.at(-1) === "A" ? "B" : "A";
      expect((await apiErrorOf(() => ledger.authenticate(`Bearer ${key.slice(0, -1)}${last}`))).code).toBe(
        "invalid_api_key",
      );
    });

    it("reuses a key for authCacheTtlMs; a revoke elsewhere reaches placeHold at once and authenticate after the TTL", async () => {
      const cached = await open({ authCacheTtlMs: 1000, instanceId: "cached" });
      try {
        const { id, key } = await ledger.createKey({ budgetTokens: 100 });
        const info = await cached.authenticate(`Bearer ${key}`);
        await ledger.revoke(id); // another ledger (another replica) revokes
        expect((await cached.authenticate(`Bearer ${key}`)).id).toBe(id); // within the TTL
        const refused = await apiErrorOf(() =>
          cached.placeHold(info, { promptTokens: 1, prompts: 1, n: 1, maxTokens: 1 }),
        );
        expect(refused.code).toBe("invalid_api_key");
        clock += 1000;
        const later = await apiErrorOf(() => cached.authenticate(`Bearer ${key}`));
        expect(later.message).toBe(
          `The API key provided (acs-…${key.slice(-4)}) has been revoked. Ask the API's operator for a new key.`,
        );
        // The same words whichever call found the key revoked.
        expect(refused.message).toBe(later.message);
      } finally {
        await cached.close();
      }
    });
  });

  describe("keys at rest", () => {
    it("stores only the SHA-256 of the key, never the key itself", async () => {
      const { id, key } = await ledger.createKey({ name: "secret", budgetTokens: 5 });
      const [row] = (await rawQuery(store, "SELECT * FROM keys WHERE id = ?", [id])) as Record<
        string,
        unknown
      >[];
      expect(Object.values(row ?? {}).some((v) => typeof v === "string" && v.includes(key.slice(4)))).toBe(
        false,
      );
      expect(Buffer.from(row?.key_hash as Buffer).toString("hex")).toMatch(/^[0-9a-f]{64}$/);
      if (store.kind === "sqlite") {
        await ledger.close();
        const path = (store.options() as { path: string }).path;
        const raw = new Database(path, { readonly: true });
        expect(raw.pragma("user_version", { simple: true })).toBe(BUDGET_SCHEMA_VERSION);
        expect(raw.pragma("journal_mode", { simple: true })).toBe("wal");
        raw.close();
        for (const file of [path, `${path}-wal`]) {
          let bytes: Buffer;
          try {
            bytes = readFileSync(file);
          } catch {
            continue;
          }
          expect(bytes.includes(Buffer.from(key.slice(4)))).toBe(false);
        }
        ledger = await open();
      }
      expect((await ledger.authenticate(`Bearer ${key}`)).id).toBe(id); // and it still opens and works
    });

    it("lists keys without the key, with a 4-character hint", async () => {
      const { id, key } = await ledger.createKey({ name: "n", budgetTokens: 7, models: ["a", "b", "a"] });
      const [listed] = await ledger.listKeys();
      expect(listed).toEqual({
        id,
        name: "n",
        hint: `acs-…${key.slice(-4)}`,
        budgetTokens: 7,
        spentTokens: 0,
        models: ["a", "b"],
        createdAt: clock,
        revokedAt: null,
        rateLimits: null,
        expiresAt: null,
        metadata: null,
      });
      expect(JSON.stringify(await ledger.listKeys())).not.toContain(key.slice(4, 40));
    });

    it("refuses by a CHECK any write that would make spent + held + leased exceed the Budget", async () => {
      const { id } = await newKey(100);
      await expect(rawQuery(store, "UPDATE keys SET spent_tokens = 101 WHERE id = ?", [id])).rejects.toThrow(
        /CHECK|check constraint/i,
      );
      await expect(
        rawQuery(store, "UPDATE keys SET held_tokens = 60, leased_tokens = 41 WHERE id = ?", [id]),
      ).rejects.toThrow(/CHECK|check constraint/i);
    });
  });

  describe("checkModel", () => {
    it("allows every model without an allow-list, only the listed ones with one (403 model_not_allowed)", async () => {
      const free = (await newKey(10)).info;
      const limited = (await newKey(10, ["llama-8b"])).info;
      expect(() => ledger.checkModel(free, "anything")).not.toThrow();
      expect(() => ledger.checkModel(limited, "llama-8b")).not.toThrow();
      const err = await apiErrorOf(() => ledger.checkModel(limited, "llama-70b"));
      expect(err.code).toBe("model_not_allowed");
      expect(err.status).toBe(403);
      expect(err.param).toBe("model");
      expect(err.message).toContain("'llama-70b'");
    });

    it("accepts a model whose alias is on the allow-list", async () => {
      const limited = (await newKey(10, ["llama-8b"])).info;
      expect(() => ledger.checkModel(limited, "meta-llama/Llama-3.1-8B", ["llama-8b"])).not.toThrow();
      expect(
        (await apiErrorOf(() => ledger.checkModel(limited, "meta-llama/Llama-3.1-70B", ["llama-70b"]))).code,
      ).toBe("model_not_allowed");
    });
  });

  describe("placeHold", () => {
    it("holds Σ prompt tokens + prompts × n × max_tokens when it fits", async () => {
      const { info, id } = await newKey(1000);
      const hold = await ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 });
      expect(hold).toMatchObject({ maxTokens: 50, clamped: false, heldTokens: 330 });
      expect(hold.holdId).toMatch(/^hold_[0-9a-f]{24}$/);
      expect(await ledger.usage(id)).toMatchObject({
        heldTokens: 330,
        availableTokens: 670,
        openHolds: 1,
        spentTokens: 0,
        leasedTokens: 0,
      });
    });

    it("holds exactly the whole Budget when the demand equals it (no clamp)", async () => {
      const { info, id } = await newKey(330);
      expect(
        await ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 }),
      ).toMatchObject({
        maxTokens: 50,
        clamped: false,
      });
      expect((await ledger.usage(id)).availableTokens).toBe(0);
    });

    it("clamps max_tokens to ⌊(available − prompt tokens) / (prompts × n)⌋ near the end of the Budget", async () => {
      const { info, id } = await newKey(1000);
      await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 700 }); // 300 left
      // (300 − 30) / (2 × 3) = 45
      const hold = await ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 });
      expect(hold).toMatchObject({ maxTokens: 45, clamped: true, heldTokens: 300 });
      expect(await ledger.usage(id)).toMatchObject({ heldTokens: 1000, availableTokens: 0 });
    });

    it("rounds the clamp down: 299 free for 6 choices after 30 prompt tokens is 44 each", async () => {
      const { info } = await newKey(299);
      expect(
        await ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 }),
      ).toMatchObject({
        maxTokens: 44,
        clamped: true,
        heldTokens: 294,
      });
    });

    it("clamps to 1 when exactly one token per choice fits", async () => {
      const { info } = await newKey(36);
      expect(
        await ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 }),
      ).toMatchObject({
        maxTokens: 1,
        clamped: true,
        heldTokens: 36,
      });
    });

    it("refuses with 429 insufficient_quota, with the numbers, when not one token per choice fits", async () => {
      const { info, id } = await newKey(100);
      await ledger.settle(
        (await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 30 })).holdId,
        20,
      );
      await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 45 }); // 80 − 45 = 35 left
      const err = await apiErrorOf(() =>
        ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 }),
      );
      expect(err.code).toBe("insufficient_quota");
      expect(err.status).toBe(429);
      expect(err.type).toBe("insufficient_quota");
      expect(err.param).toBeNull();
      expect(err.message).toBe(
        "You exceeded your current quota: this request needs at least 36 tokens (30 prompt tokens + 6 × 1 " +
          "generated token), and the key's Budget has 35 of 100 tokens left (20 spent, 45 held by requests in flight).",
      );
      expect(await ledger.usage(id)).toMatchObject({ openHolds: 1, heldTokens: 45 }); // nothing was held
    });

    it("refuses a key revoked after authenticate (401)", async () => {
      const { info, id } = await newKey(100);
      await ledger.revoke(id);
      const err = await apiErrorOf(() =>
        ledger.placeHold(info, { promptTokens: 1, prompts: 1, n: 1, maxTokens: 1 }),
      );
      expect(err.code).toBe("invalid_api_key");
      expect((await ledger.usage(id)).openHolds).toBe(0);
    });

    it.each([
      { promptTokens: -1, prompts: 1, n: 1, maxTokens: 1 },
      { promptTokens: 1.5, prompts: 1, n: 1, maxTokens: 1 },
      { promptTokens: 1, prompts: 0, n: 1, maxTokens: 1 },
      { promptTokens: 1, prompts: 1, n: 0, maxTokens: 1 },
      { promptTokens: 1, prompts: 1, n: 1, maxTokens: 0 },
      { promptTokens: 1, prompts: 1, n: 1, maxTokens: Number.NaN },
    ])("throws RangeError for a demand out of range: %o", async (demand) => {
      const { info } = await newKey(100);
      await expect(ledger.placeHold(info, demand)).rejects.toThrow(RangeError);
    });
  });

  describe("settle", () => {
    it("charges the tokens used and releases the rest, exactly once", async () => {
      const { info, id } = await newKey(1000);
      const hold = await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 2, maxTokens: 100 }); // 210
      expect(await ledger.settle(hold.holdId, 57)).toEqual({
        outcome: "settled",
        chargedTokens: 57,
        releasedTokens: 153,
      });
      expect(await ledger.usage(id)).toMatchObject({
        spentTokens: 57,
        heldTokens: 0,
        availableTokens: 943,
        settledHolds: 1,
      });
      for (const used of [57, 200]) {
        expect(await ledger.settle(hold.holdId, used)).toEqual({
          outcome: "already_settled",
          chargedTokens: 0,
          releasedTokens: 0,
        });
      }
      expect(await ledger.usage(id)).toMatchObject({ spentTokens: 57, settledHolds: 1 });
    });

    it("never charges more than was held (usage above the Hold is capped)", async () => {
      const { info, id } = await newKey(1000);
      const hold = await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 20 });
      expect(await ledger.settle(hold.holdId, 31)).toEqual({
        outcome: "settled",
        chargedTokens: 30,
        releasedTokens: 0,
      });
      expect((await ledger.usage(id)).spentTokens).toBe(30);
    });

    it("charges 0 for a request that used nothing (refused by Inference before any token)", async () => {
      const { info, id } = await newKey(50);
      const hold = await ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 40 });
      expect((await ledger.settle(hold.holdId, 0)).chargedTokens).toBe(0);
      expect(await ledger.usage(id)).toMatchObject({ spentTokens: 0, availableTokens: 50 });
    });

    it("throws UnknownIdError for an unknown Hold and RangeError for bad usage", async () => {
      const { info } = await newKey(50);
      const hold = await ledger.placeHold(info, { promptTokens: 1, prompts: 1, n: 1, maxTokens: 1 });
      await expect(ledger.settle("hold_nope", 1)).rejects.toThrow(UnknownIdError);
      await expect(ledger.settle(hold.holdId, -1)).rejects.toThrow(RangeError);
      await expect(ledger.settle(hold.holdId, 0.5)).rejects.toThrow(RangeError);
    });
  });

  describe("usage per key and day", () => {
    it("adds every charge to its UTC day; spent = Σ of the days; closed Holds are deleted after the retention", async () => {
      const { info, id } = await newKey(10_000);
      const day1 = utcDay(clock);
      for (const used of [10, 20]) {
        await ledger.settle(
          (await ledger.placeHold(info, { promptTokens: 5, prompts: 1, n: 1, maxTokens: 50 })).holdId,
          used,
        );
      }
      const stale = await ledger.placeHold(info, { promptTokens: 5, prompts: 1, n: 1, maxTokens: 50 });
      await ledger.renew(stale.holdId, 7);
      clock += 24 * 3600_000; // the next day
      const day2 = utcDay(clock);
      await ledger.settle(
        (await ledger.placeHold(info, { promptTokens: 5, prompts: 1, n: 1, maxTokens: 50 })).holdId,
        40,
      );
      expect(await ledger.reclaimStale()).toEqual({ holds: 1, leases: 0 }); // charged the 7 it recorded

      const usage = await ledger.usage(id);
      expect(usage.daily).toEqual([
        { day: day2, chargedTokens: 47, settledHolds: 1, reclaimedHolds: 1 },
        { day: day1, chargedTokens: 30, settledHolds: 2, reclaimedHolds: 0 },
      ]);
      expect(usage).toMatchObject({ spentTokens: 77, settledHolds: 3, reclaimedHolds: 1, openHolds: 0 });
      expect(usage.spentTokens).toBe(usage.daily.reduce((s, d) => s + d.chargedTokens, 0));
      expect((await ledger.usage(id, 1)).daily).toHaveLength(1);

      // The Holds of day 1 were closed more than the retention (= hold TTL) ago: deleted; usage stays.
      const counted = (await rawQuery(store, "SELECT count(*) AS n FROM holds WHERE key_id = ?", [id])) as {
        n: number | string;
      }[];
      expect(Number(counted[0]?.n)).toBe(2); // day 2's settled and reclaimed Holds
      expect((await ledger.usage(id)).daily).toEqual(usage.daily);
    });
  });

  describe("renew and reclaim", () => {
    it("reclaims a Hold past its expiry unless it was renewed, charging what its last renewal recorded", async () => {
      const { info, id } = await newKey(1000);
      const kept = await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 100 });
      const stale = await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 200 });
      clock += DEFAULT_HOLD_TTL_MS - 1;
      expect(await ledger.reclaimStale()).toEqual({ holds: 0, leases: 0 });
      expect(await ledger.renew(kept.holdId, 30)).toBe(true);
      clock += 1;
      expect((await ledger.reclaimStale()).holds).toBe(1);
      expect(await ledger.usage(id)).toMatchObject({
        heldTokens: 100,
        spentTokens: 0, // the stale one was never renewed: charged nothing
        openHolds: 1,
        reclaimedHolds: 1,
      });
      expect(await ledger.renew(stale.holdId, 50)).toBe(false);
      expect(await ledger.renew(kept.holdId, 20)).toBe(true); // the largest recorded use wins
      clock += DEFAULT_HOLD_TTL_MS;
      expect((await ledger.reclaimStale()).holds).toBe(1);
      expect(await ledger.usage(id)).toMatchObject({ heldTokens: 0, spentTokens: 30, availableTokens: 970 });
    });

    it("renew takes an explicit TTL", async () => {
      const { info } = await newKey(1000);
      const hold = await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 1 });
      expect(await ledger.renew(hold.holdId, 0, 60 * 60_000)).toBe(true);
      clock += 59 * 60_000;
      expect((await ledger.reclaimStale()).holds).toBe(0);
      clock += 60_000;
      expect((await ledger.reclaimStale()).holds).toBe(1);
    });

    it("a late settle after reclaim charges the rest of its use, at most what the Budget still has free, once", async () => {
      const { info, id } = await newKey(100);
      const late = await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 60 });
      await ledger.renew(late.holdId, 10); // recorded 10 (charged by the reclaim)
      clock += DEFAULT_HOLD_TTL_MS;
      expect((await ledger.reclaimStale()).holds).toBe(1);
      await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 75 }); // 15 free
      expect(await ledger.settle(late.holdId, 50)).toEqual({
        outcome: "settled_after_reclaim",
        chargedTokens: 15, // 40 more wanted, 15 free
        releasedTokens: 0,
      });
      expect((await ledger.settle(late.holdId, 50)).outcome).toBe("already_settled");
      expect(await ledger.usage(id)).toMatchObject({ spentTokens: 25, heldTokens: 75, availableTokens: 0 });
    });

    it("reclaimOnStart releases every open Hold, or only this instance's", async () => {
      const { info, id } = await newKey(1000);
      await ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 10 });
      const other = await open({ instanceId: "test-b" });
      try {
        await other.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 20 });
        const renewed = await other.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 30 });
        await other.renew(renewed.holdId, 12);
        expect(await other.reclaimOnStart("instance")).toEqual({ holds: 2, leases: 0 });
        expect(await ledger.usage(id)).toMatchObject({ openHolds: 1, heldTokens: 10, spentTokens: 12 });
        await other.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 40 });
        expect(await other.reclaimOnStart()).toEqual({ holds: 2, leases: 0 });
        expect(await ledger.usage(id)).toMatchObject({
          openHolds: 0,
          heldTokens: 0,
          spentTokens: 12,
          reclaimedHolds: 4,
        });
      } finally {
        await other.close();
      }
    });

    it("runs reclaimStale on its timer", async () => {
      const { id, key } = await ledger.createKey({ budgetTokens: 100 });
      const timed = await createBudgetLedger({
        ...store.options(),
        holdTtlMs: 1,
        reclaimIntervalMs: 10,
        leases: false,
      });
      try {
        await timed.placeHold(await timed.authenticate(`Bearer ${key}`), {
          promptTokens: 0,
          prompts: 1,
          n: 1,
          maxTokens: 5,
        });
        await until(
          async () => (await ledger.usage(id)).openHolds === 0,
          "the timer reclaimed the stale Hold",
        );
        expect(await ledger.usage(id)).toMatchObject({ openHolds: 0, reclaimedHolds: 1, spentTokens: 0 });
      } finally {
        await timed.close();
        await timed.close(); // idempotent
      }
    });
  });

  describe("key admin", () => {
    it("grant adds to the Budget; revoke keeps the first time; usage reports the numbers", async () => {
      const { id, info } = await newKey(10);
      expect(await ledger.grant(id, 15)).toMatchObject({ budgetTokens: 25, availableTokens: 25 });
      await ledger.settle(
        (await ledger.placeHold(info, { promptTokens: 5, prompts: 1, n: 1, maxTokens: 5 })).holdId,
        7,
      );
      expect((await ledger.revoke(id)).revokedAt).toBe(clock);
      const first = clock;
      clock += 1000;
      expect((await ledger.revoke(id)).revokedAt).toBe(first);
      expect(await ledger.usage(id)).toMatchObject({
        budgetTokens: 25,
        spentTokens: 7,
        heldTokens: 0,
        availableTokens: 18,
        settledHolds: 1,
        revokedAt: first,
      });
    });

    it("throws UnknownIdError for unknown ids and RangeError for bad amounts", async () => {
      await expect(ledger.grant("key_000000000000", 1)).rejects.toThrow(UnknownIdError);
      await expect(ledger.revoke("key_000000000000")).rejects.toThrow(UnknownIdError);
      await expect(ledger.usage("key_000000000000")).rejects.toThrow(UnknownIdError);
      const { id } = await newKey(1);
      await expect(ledger.grant(id, 0)).rejects.toThrow(RangeError);
      await expect(ledger.createKey({ budgetTokens: -1 })).rejects.toThrow(RangeError);
    });

    it("refuses to open a database whose schema is newer than the code", async () => {
      await ledger.close();
      if (store.kind === "sqlite") {
        const path = (store.options() as { path: string }).path;
        const raw = new Database(path);
        raw.pragma(`user_version = ${BUDGET_SCHEMA_VERSION + 1}`);
        raw.close();
        await expect(open()).rejects.toThrow(/newer than this code/);
        const fix = new Database(path);
        fix.pragma(`user_version = ${BUDGET_SCHEMA_VERSION}`);
        fix.close();
      } else {
        const next = POSTGRES_BUDGET_SCHEMA_VERSION + 1;
        await rawQuery(store, "INSERT INTO budget_schema_migrations (version, applied_at) VALUES (?, 0)", [
          next,
        ]);
        await expect(open()).rejects.toThrow(/newer than this code/);
        await rawQuery(store, "DELETE FROM budget_schema_migrations WHERE version = ?", [next]);
      }
      ledger = await open();
    });
  });
});
