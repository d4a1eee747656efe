import { readFileSync } from "node:fs";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  BUDGET_SCHEMA_VERSION,
  type BudgetLedger,
  createBudgetLedger,
  DEFAULT_HOLD_TTL_MS,
  type KeyInfo,
  UnknownIdError,
} from "../../src/budget/index.js";
import { ApiError } from "../../src/errors/index.js";
import { until } from "../helpers/hang-guard.js";
import { tempDb } from "./helpers.js";

let db: ReturnType<typeof tempDb>;
let ledger: BudgetLedger;
let clock: number;

beforeEach(() => {
  db = tempDb();
  clock = 1_800_000_000_000;
  ledger = createBudgetLedger({
    path: db.path,
    now: () => clock,
    reclaimIntervalMs: 0,
    instanceId: "test-a",
  });
});
afterEach(() => {
  ledger.close();
  db.cleanup();
});

/** Calls fn and returns the ApiError it throws (fails the test when it throws nothing else). */
function apiErrorOf(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ApiError);
    return err as ApiError;
  }
  throw new Error("expected an ApiError, nothing was thrown");
}

function newKey(budgetTokens: number, models?: string[]): { info: KeyInfo; key: string; id: string } {
  const { id, key } = ledger.createKey({
    name: "t",
    budgetTokens,
    ...(models === undefined ? {} : { models }),
  });
  return { info: ledger.authenticate(`Bearer ${key}`), key, id };
}

describe("authenticate", () => {
  it("returns the key's id, name and models for a good key, whatever the case of the scheme", () => {
    const { id, key } = ledger.createKey({ name: "alice", budgetTokens: 10, models: ["llama-8b"] });
    expect(key).toMatch(/^acs-[A-Za-z0-9_-]{43}$/);
    expect(id).toMatch(/^key_[0-9a-f]{12}$/);
    for (const header of [`Bearer ${key}`, `bearer ${key}`, `BEARER ${key}`, `  Bearer   ${key}  `]) {
      expect(ledger.authenticate(header)).toEqual({ id, name: "alice", models: ["llama-8b"] });
    }
  });

  it.each([
    ["missing header", undefined, /^You didn't provide an API key\. .*Authorization: Bearer YOUR_KEY/],
    ["empty header", "", /^You didn't provide an API key\./],
    ["Bearer without a key", "Bearer   ", /^You didn't provide an API key\./],
    ["wrong scheme", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", /^Unsupported authorization scheme\. .*Bearer auth/],
    ["a bare key", "acs-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", /^Unsupported authorization scheme\./],
    [
      "unknown key",
      "Bearer acs-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
      /^Incorrect API key provided: acs-AAA\*\*\*AAAA\./,
    ],
    ["unknown short junk", "Bearer x", /^Incorrect API key provided\. /],
  ])("%s → 401 invalid_api_key, param null", (_name, header, message) => {
    ledger.createKey({ budgetTokens: 10 });
    const err = apiErrorOf(() => ledger.authenticate(header));
    expect(err.code).toBe("invalid_api_key");
    expect(err.status).toBe(401);
    expect(err.type).toBe("invalid_request_error");
    expect(err.param).toBeNull();
    expect(err.message).toMatch(message);
  });

  it("refuses a revoked key, and only that key", () => {
    const a = ledger.createKey({ budgetTokens: 10 });
    const b = ledger.createKey({ budgetTokens: 10 });
    ledger.revoke(a.id);
    const err = apiErrorOf(() => ledger.authenticate(`Bearer ${a.key}`));
    expect(err.code).toBe("invalid_api_key");
    expect(err.status).toBe(401);
    expect(err.message).toMatch(/has been revoked/);
    expect(err.message).not.toContain(a.key);
    expect(ledger.authenticate(`Bearer ${b.key}`).id).toBe(b.id);
  });

  it("does not accept a key that differs in one character", () => {
    const { key } = ledger.createKey({ budgetTokens: 10 });
    const last = key.at(-1) === "A" ? "B" : "A";
    expect(apiErrorOf(() => ledger.authenticate(`Bearer ${key.slice(0, -1)}${last}`)).code).toBe(
      "invalid_api_key",
    );
  });
});

describe("keys at rest", () => {
  it("stores only the SHA-256 of the key, never the key itself", () => {
    const { id, key } = ledger.createKey({ name: "secret", budgetTokens: 5 });
    ledger.close();
    const raw = new Database(db.path, { readonly: true });
    const row = raw.prepare("SELECT * FROM keys WHERE id = ?").get(id) as Record<string, unknown>;
    expect(raw.pragma("user_version", { simple: true })).toBe(BUDGET_SCHEMA_VERSION);
    expect(raw.pragma("journal_mode", { simple: true })).toBe("wal");
    raw.close();
    expect(Object.values(row).some((v) => typeof v === "string" && v.includes(key.slice(4)))).toBe(false);
    expect(Buffer.from(row.key_hash as Buffer).toString("hex")).toMatch(/^[0-9a-f]{64}$/);
    for (const file of [db.path, `${db.path}-wal`]) {
      let bytes: Buffer;
      try {
        bytes = readFileSync(file);
      } catch {
        continue;
      }
      expect(bytes.includes(Buffer.from(key.slice(4)))).toBe(false);
    }
    ledger = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
    expect(ledger.authenticate(`Bearer ${key}`).id).toBe(id); // and it still opens and works
  });

  it("lists keys without the key, with a 4-character hint", () => {
    const { id, key } = ledger.createKey({ name: "n", budgetTokens: 7, models: ["a", "b", "a"] });
    const [listed] = ledger.listKeys();
    expect(listed).toEqual({
      id,
      name: "n",
      hint: `acs-…${key.slice(-4)}`,
      budgetTokens: 7,
      spentTokens: 0,
      models: ["a", "b"],
      createdAt: clock,
      revokedAt: null,
    });
    expect(JSON.stringify(ledger.listKeys())).not.toContain(key.slice(4, 40));
  });
});

describe("checkModel", () => {
  it("allows every model without an allow-list, only the listed ones with one (403 model_not_allowed)", () => {
    const open = newKey(10).info;
    const limited = newKey(10, ["llama-8b"]).info;
    expect(() => ledger.checkModel(open, "anything")).not.toThrow();
    expect(() => ledger.checkModel(limited, "llama-8b")).not.toThrow();
    const err = apiErrorOf(() => ledger.checkModel(limited, "llama-70b"));
    expect(err.code).toBe("model_not_allowed");
    expect(err.status).toBe(403);
    expect(err.param).toBe("model");
    expect(err.message).toContain("'llama-70b'");
  });

  it("accepts a model whose alias is on the allow-list", () => {
    const limited = newKey(10, ["llama-8b"]).info;
    expect(() => ledger.checkModel(limited, "meta-llama/Llama-3.1-8B", ["llama-8b"])).not.toThrow();
    expect(apiErrorOf(() => ledger.checkModel(limited, "meta-llama/Llama-3.1-70B", ["llama-70b"])).code).toBe(
      "model_not_allowed",
    );
  });
});

describe("placeHold", () => {
  it("holds Σ prompt tokens + prompts × n × max_tokens when it fits", () => {
    const { info, id } = newKey(1000);
    const hold = ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 });
    expect(hold).toMatchObject({ maxTokens: 50, clamped: false, heldTokens: 330 });
    expect(hold.holdId).toMatch(/^hold_[0-9a-f]{24}$/);
    expect(ledger.usage(id)).toMatchObject({
      heldTokens: 330,
      availableTokens: 670,
      openHolds: 1,
      spentTokens: 0,
    });
  });

  it("holds exactly the whole Budget when the demand equals it (no clamp)", () => {
    const { info, id } = newKey(330);
    expect(ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 })).toMatchObject({
      maxTokens: 50,
      clamped: false,
    });
    expect(ledger.usage(id).availableTokens).toBe(0);
  });

  it("clamps max_tokens to ⌊(available − prompt tokens) / (prompts × n)⌋ near the end of the Budget", () => {
    const { info, id } = newKey(1000);
    ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 700 }); // 300 left
    // (300 − 30) / (2 × 3) = 45
    const hold = ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 });
    expect(hold).toMatchObject({ maxTokens: 45, clamped: true, heldTokens: 300 });
    expect(ledger.usage(id)).toMatchObject({ heldTokens: 1000, availableTokens: 0 });
  });

  it("rounds the clamp down: 299 free for 6 choices after 30 prompt tokens is 44 each", () => {
    const { info } = newKey(299);
    expect(ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 })).toMatchObject({
      maxTokens: 44,
      clamped: true,
      heldTokens: 294,
    });
  });

  it("clamps to 1 when exactly one token per choice fits", () => {
    const { info } = newKey(36);
    expect(ledger.placeHold(info, { promptTokens: 30, prompts: 2, n: 3, maxTokens: 50 })).toMatchObject({
      maxTokens: 1,
      clamped: true,
      heldTokens: 36,
    });
  });

  it("refuses with 429 insufficient_quota, with the numbers, when not one token per choice fits", () => {
    const { info, id } = newKey(100);
    ledger.settle(ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 30 }).holdId, 20);
    ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 45 }); // 80 − 45 = 35 left
    const err = apiErrorOf(() =>
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
    expect(ledger.usage(id)).toMatchObject({ openHolds: 1, heldTokens: 45 }); // nothing was held
  });

  it("refuses a key revoked after authenticate (401)", () => {
    const { info, id } = newKey(100);
    ledger.revoke(id);
    const err = apiErrorOf(() => ledger.placeHold(info, { promptTokens: 1, prompts: 1, n: 1, maxTokens: 1 }));
    expect(err.code).toBe("invalid_api_key");
    expect(ledger.usage(id).openHolds).toBe(0);
  });

  it.each([
    { promptTokens: -1, prompts: 1, n: 1, maxTokens: 1 },
    { promptTokens: 1.5, prompts: 1, n: 1, maxTokens: 1 },
    { promptTokens: 1, prompts: 0, n: 1, maxTokens: 1 },
    { promptTokens: 1, prompts: 1, n: 0, maxTokens: 1 },
    { promptTokens: 1, prompts: 1, n: 1, maxTokens: 0 },
    { promptTokens: 1, prompts: 1, n: 1, maxTokens: Number.NaN },
  ])("throws RangeError for a demand out of range: %o", (demand) => {
    const { info } = newKey(100);
    expect(() => ledger.placeHold(info, demand)).toThrow(RangeError);
  });
});

describe("settle", () => {
  it("charges the tokens used and releases the rest, exactly once", () => {
    const { info, id } = newKey(1000);
    const hold = ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 2, maxTokens: 100 }); // 210
    expect(ledger.settle(hold.holdId, 57)).toEqual({
      outcome: "settled",
      chargedTokens: 57,
      releasedTokens: 153,
    });
    expect(ledger.usage(id)).toMatchObject({
      spentTokens: 57,
      heldTokens: 0,
      availableTokens: 943,
      settledHolds: 1,
    });
    expect(ledger.settle(hold.holdId, 57)).toEqual({
      outcome: "already_settled",
      chargedTokens: 0,
      releasedTokens: 0,
    });
    expect(ledger.settle(hold.holdId, 200)).toEqual({
      outcome: "already_settled",
      chargedTokens: 0,
      releasedTokens: 0,
    });
    expect(ledger.usage(id)).toMatchObject({ spentTokens: 57, settledHolds: 1 });
  });

  it("never charges more than was held (usage above the Hold is capped)", () => {
    const { info, id } = newKey(1000);
    const hold = ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 20 });
    expect(ledger.settle(hold.holdId, 31)).toEqual({
      outcome: "settled",
      chargedTokens: 30,
      releasedTokens: 0,
    });
    expect(ledger.usage(id).spentTokens).toBe(30);
  });

  it("charges 0 for a request that used nothing (refused by Inference before any token)", () => {
    const { info, id } = newKey(50);
    const hold = ledger.placeHold(info, { promptTokens: 10, prompts: 1, n: 1, maxTokens: 40 });
    expect(ledger.settle(hold.holdId, 0).chargedTokens).toBe(0);
    expect(ledger.usage(id)).toMatchObject({ spentTokens: 0, availableTokens: 50 });
  });

  it("throws UnknownIdError for an unknown Hold and RangeError for bad usage", () => {
    const { info } = newKey(50);
    const hold = ledger.placeHold(info, { promptTokens: 1, prompts: 1, n: 1, maxTokens: 1 });
    expect(() => ledger.settle("hold_nope", 1)).toThrow(UnknownIdError);
    expect(() => ledger.settle(hold.holdId, -1)).toThrow(RangeError);
    expect(() => ledger.settle(hold.holdId, 0.5)).toThrow(RangeError);
  });
});

describe("renew and reclaim", () => {
  it("reclaims a Hold past its expiry (charging nothing) unless it was renewed", () => {
    const { info, id } = newKey(1000);
    const kept = ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 100 });
    const stale = ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 200 });
    clock += DEFAULT_HOLD_TTL_MS - 1;
    expect(ledger.reclaimStale()).toBe(0);
    expect(ledger.renew(kept.holdId)).toBe(true);
    clock += 1;
    expect(ledger.reclaimStale()).toBe(1);
    expect(ledger.usage(id)).toMatchObject({
      heldTokens: 100,
      spentTokens: 0,
      openHolds: 1,
      reclaimedHolds: 1,
    });
    expect(ledger.renew(stale.holdId)).toBe(false);
    clock += DEFAULT_HOLD_TTL_MS;
    expect(ledger.reclaimStale()).toBe(1);
    expect(ledger.usage(id)).toMatchObject({ heldTokens: 0, spentTokens: 0, availableTokens: 1000 });
  });

  it("renew takes an explicit TTL", () => {
    const { info } = newKey(1000);
    const hold = ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 1 });
    expect(ledger.renew(hold.holdId, 60 * 60_000)).toBe(true);
    clock += 59 * 60_000;
    expect(ledger.reclaimStale()).toBe(0);
    clock += 60_000;
    expect(ledger.reclaimStale()).toBe(1);
  });

  it("a late settle after reclaim charges only what the Budget still has free, once", () => {
    const { info, id } = newKey(100);
    const late = ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 60 });
    clock += DEFAULT_HOLD_TTL_MS;
    expect(ledger.reclaimStale()).toBe(1);
    ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 80 }); // 20 free
    expect(ledger.settle(late.holdId, 50)).toEqual({
      outcome: "settled_after_reclaim",
      chargedTokens: 20,
      releasedTokens: 0,
    });
    expect(ledger.settle(late.holdId, 50).outcome).toBe("already_settled");
    expect(ledger.usage(id)).toMatchObject({ spentTokens: 20, heldTokens: 80, availableTokens: 0 });
  });

  it("reclaimOnStart releases every open Hold, or only this instance's", () => {
    const { info, id } = newKey(1000);
    ledger.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 10 });
    const other = createBudgetLedger({ path: db.path, instanceId: "test-b", reclaimIntervalMs: 0 });
    other.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 20 });
    other.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 30 });
    expect(other.reclaimOnStart("instance")).toBe(2);
    expect(ledger.usage(id)).toMatchObject({ openHolds: 1, heldTokens: 10 });
    other.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: 40 });
    expect(other.reclaimOnStart()).toBe(2);
    expect(ledger.usage(id)).toMatchObject({
      openHolds: 0,
      heldTokens: 0,
      spentTokens: 0,
      reclaimedHolds: 4,
    });
    other.close();
  });

  it("runs reclaimStale on its timer", async () => {
    const { id, key } = ledger.createKey({ budgetTokens: 100 });
    const timed = createBudgetLedger({ path: db.path, holdTtlMs: 1, reclaimIntervalMs: 10 });
    timed.placeHold(timed.authenticate(`Bearer ${key}`), { promptTokens: 0, prompts: 1, n: 1, maxTokens: 5 });
    expect(ledger.usage(id).openHolds).toBe(1);
    await until(() => ledger.usage(id).openHolds === 0, "the timer reclaimed the stale Hold");
    expect(ledger.usage(id)).toMatchObject({ openHolds: 0, reclaimedHolds: 1, spentTokens: 0 });
    timed.close();
    timed.close(); // idempotent
  });
});

describe("key admin", () => {
  it("grant adds to the Budget; revoke keeps the first time; usage reports the numbers", () => {
    const { id, info } = newKey(10);
    expect(ledger.grant(id, 15)).toMatchObject({ budgetTokens: 25, availableTokens: 25 });
    ledger.settle(ledger.placeHold(info, { promptTokens: 5, prompts: 1, n: 1, maxTokens: 5 }).holdId, 7);
    expect(ledger.revoke(id).revokedAt).toBe(clock);
    const first = clock;
    clock += 1000;
    expect(ledger.revoke(id).revokedAt).toBe(first);
    expect(ledger.usage(id)).toMatchObject({
      budgetTokens: 25,
      spentTokens: 7,
      heldTokens: 0,
      availableTokens: 18,
      settledHolds: 1,
      revokedAt: first,
    });
  });

  it("throws UnknownIdError for unknown ids and RangeError for bad amounts", () => {
    expect(() => ledger.grant("key_000000000000", 1)).toThrow(UnknownIdError);
    expect(() => ledger.revoke("key_000000000000")).toThrow(UnknownIdError);
    expect(() => ledger.usage("key_000000000000")).toThrow(UnknownIdError);
    const { id } = newKey(1);
    expect(() => ledger.grant(id, 0)).toThrow(RangeError);
    expect(() => ledger.createKey({ budgetTokens: -1 })).toThrow(RangeError);
  });

  it("refuses to open a file whose schema is newer than the code", () => {
    ledger.close();
    const raw = new Database(db.path);
    raw.pragma(`user_version = ${BUDGET_SCHEMA_VERSION + 1}`);
    raw.close();
    expect(() => createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 })).toThrow(/newer than this code/);
    const fix = new Database(db.path);
    fix.pragma(`user_version = ${BUDGET_SCHEMA_VERSION}`);
    fix.close();
    ledger = createBudgetLedger({ path: db.path, reclaimIntervalMs: 0 });
  });
});
