// The admin operations of the ledger (issue 35, first slice), one suite on both stores: a key's
// settings (rate limits, expiry, metadata), pages of keys, update, rotate, revoke, admin keys, and
// the audit log (one row per change, in its transaction, append-only).
import Database from "better-sqlite3";
import pg from "pg";
import { describe, expect, it } from "vitest";
import { type BudgetLedger, KeySettingError, UnknownIdError } from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { clockedLedgers, type StoreUnderTest, storesUnderTest } from "./helpers.js";

/** The error fn throws (fails the test when it throws nothing). */
async function errorOf(fn: () => unknown): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  throw new Error("expected an error, nothing was thrown");
}

/** The ApiError's code and status, to compare. */
async function refusal(fn: () => unknown): Promise<{ code: string; status: number; message: string }> {
  const err = await errorOf(fn);
  expect(err).toBeInstanceOf(ApiError);
  const e = err as ApiError;
  return { code: e.code, status: e.status, message: e.message };
}

/** Runs one statement on the store's database directly, outside the gateway's code. */
async function rawExec(store: StoreUnderTest, sql: string): Promise<void> {
  if (store.kind === "sqlite") {
    const raw = new Database((store.options() as { path: string }).path);
    try {
      raw.exec(sql);
    } finally {
      raw.close();
    }
    return;
  }
  const client = new pg.Client({ connectionString: store.acsDb() });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

const demand = { promptTokens: 3, prompts: 1, n: 1, maxTokens: 2 };

describe.each(storesUnderTest("keyadmin"))("key administration on $kind", (store) => {
  const { clock, open } = clockedLedgers(store, {});

  it("creates a key with rate limits, expiry and metadata, and returns them", async () => {
    const ledger = await open();
    const limits = {
      requestsPerMinute: 60,
      tokensPerMinute: 1000,
      models: { "llama-8b": { requestsPerMinute: 5 } },
    };
    const created = await ledger.createKey({
      name: "team",
      budgetTokens: 100,
      models: ["llama-8b"],
      rateLimits: limits,
      expiresAt: clock.now + 60_000,
      metadata: { team: "ml", env: "prod" },
    });
    expect(created.key).toMatch(/^acs-[A-Za-z0-9_-]{43}$/);
    expect(created.id).toMatch(/^key_[0-9a-f]{12}$/);
    const got = await ledger.getKey(created.id);
    expect(got).toEqual({
      id: created.id,
      name: "team",
      hint: `acs-…${created.key.slice(-4)}`,
      budgetTokens: 100,
      spentTokens: 0,
      models: ["llama-8b"],
      createdAt: clock.now,
      revokedAt: null,
      rateLimits: limits,
      expiresAt: clock.now + 60_000,
      metadata: { team: "ml", env: "prod" },
    });
    expect(await errorOf(() => ledger.getKey("key_000000000000"))).toBeInstanceOf(UnknownIdError);
  });

  it("refuses settings past their caps, naming the param", async () => {
    const ledger = await open();
    const param = async (fn: () => unknown) => {
      const err = await errorOf(fn);
      expect(err).toBeInstanceOf(KeySettingError);
      return (err as KeySettingError).param;
    };
    const many = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"]));
    expect(await param(() => ledger.createKey({ budgetTokens: 1, metadata: many }))).toBe("metadata");
    expect(
      await param(() => ledger.createKey({ budgetTokens: 1, metadata: { ["k".repeat(65)]: "v" } })),
    ).toBe("metadata");
    expect(await param(() => ledger.createKey({ budgetTokens: 1, metadata: { k: "v".repeat(513) } }))).toBe(
      "metadata",
    );
    expect(
      await param(() => ledger.createKey({ budgetTokens: 1, rateLimits: { requestsPerMinute: 0 } })),
    ).toBe("rate_limits.requests_per_minute");
    expect(await param(() => ledger.createKey({ budgetTokens: 1, expiresAt: -1 }))).toBe("expires_at");
    // At the caps: accepted.
    const sixteen = Object.fromEntries(
      Array.from({ length: 16 }, (_, i) => [`${"k".repeat(62)}${i}`.slice(-64), "v".repeat(512)]),
    );
    await ledger.createKey({ budgetTokens: 1, metadata: sixteen });
    expect(await ledger.listKeys()).toHaveLength(1);
  });

  it("pages keys newest first, after a cursor, up to 100 a page", async () => {
    const ledger = await open();
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      clock.now += 1;
      ids.push((await ledger.createKey({ budgetTokens: i })).id);
    }
    const newestFirst = [...ids].reverse();
    const seen: string[] = [];
    let after: string | undefined;
    const pages: boolean[] = [];
    for (;;) {
      const page = await ledger.listKeysPage({ limit: 2, ...(after === undefined ? {} : { after }) });
      seen.push(...page.items.map((k) => k.id));
      pages.push(page.hasMore);
      if (!page.hasMore) break;
      after = page.items.at(-1)?.id;
    }
    expect(seen).toEqual(newestFirst);
    expect(pages).toEqual([true, true, false]);
    expect(
      ((await errorOf(() => ledger.listKeysPage({ limit: 2, after: "key_000000000000" }))) as KeySettingError)
        .param,
    ).toBe("after");
    expect(((await errorOf(() => ledger.listKeysPage({ limit: 101 }))) as KeySettingError).param).toBe(
      "limit",
    );
  });

  it("updates name, Budget, models, limits, expiry and metadata; refuses a Budget below what is spent", async () => {
    const ledger = await open();
    const { id, key } = await ledger.createKey({ budgetTokens: 10 });
    const info = await ledger.authenticate(`Bearer ${key}`);
    const hold = await ledger.placeHold(info, demand);
    if ("countNeeded" in hold) throw new Error("unexpected");
    await ledger.settle(hold.holdId, 4);
    const updated = await ledger.updateKey(id, {
      name: "renamed",
      addTokens: 5,
      models: ["a"],
      rateLimits: { tokensPerMinute: 10 },
      expiresAt: clock.now + 1000,
      metadata: { a: "b" },
    });
    expect(updated).toMatchObject({
      name: "renamed",
      budgetTokens: 15,
      spentTokens: 4,
      models: ["a"],
      rateLimits: { tokensPerMinute: 10 },
      expiresAt: clock.now + 1000,
      metadata: { a: "b" },
    });
    expect(
      (await ledger.updateKey(id, { budgetTokens: 7, metadata: null, rateLimits: null })).budgetTokens,
    ).toBe(7);
    expect(await ledger.getKey(id)).toMatchObject({ metadata: null, rateLimits: null, name: "renamed" });
    const low = await errorOf(() => ledger.updateKey(id, { budgetTokens: 3 }));
    expect(low).toBeInstanceOf(KeySettingError);
    expect((low as KeySettingError).param).toBe("budget_tokens");
    expect((low as KeySettingError).message).toContain("4 tokens already spent or held");
    expect((await ledger.getKey(id)).budgetTokens).toBe(7);
    expect(await errorOf(() => ledger.updateKey("key_000000000000", { name: "x" }))).toBeInstanceOf(
      UnknownIdError,
    );
  });

  it("refuses an add that would take the Budget past 2^53 − 1 (an exact integer on every surface)", async () => {
    const ledger = await open();
    const { id } = await ledger.createKey({ budgetTokens: Number.MAX_SAFE_INTEGER - 1 });
    const over = await errorOf(() => ledger.updateKey(id, { addTokens: 2 }));
    expect(over).toBeInstanceOf(KeySettingError);
    expect((over as KeySettingError).param).toBe("add_budget_tokens");
    expect((await ledger.getKey(id)).budgetTokens).toBe(Number.MAX_SAFE_INTEGER - 1);
    expect((await ledger.updateKey(id, { addTokens: 1 })).budgetTokens).toBe(Number.MAX_SAFE_INTEGER);
  });

  it("rotates: the old secret 401 at once, the new one works, same id, spent and usage", async () => {
    const ledger = await open({ authCacheTtlMs: 1000 });
    const { id, key } = await ledger.createKey({ budgetTokens: 100 });
    const info = await ledger.authenticate(`Bearer ${key}`); // cached now
    const hold = await ledger.placeHold(info, demand);
    if ("countNeeded" in hold) throw new Error("unexpected");
    await ledger.settle(hold.holdId, 5);
    const rotated = await ledger.rotateKey(id);
    expect(rotated.id).toBe(id);
    expect(rotated.key).not.toBe(key);
    expect(rotated.hint).toBe(`acs-…${rotated.key.slice(-4)}`);
    expect((await refusal(() => ledger.authenticate(`Bearer ${key}`))).status).toBe(401);
    const again = await ledger.authenticate(`Bearer ${rotated.key}`);
    expect(again.id).toBe(id);
    expect(await ledger.usage(id)).toMatchObject({ spentTokens: 5, settledHolds: 1, budgetTokens: 100 });
    await ledger.revoke(id);
    expect(await errorOf(() => ledger.rotateKey(id))).toBeInstanceOf(KeySettingError);
  });

  it("rotate on one replica: another that read the old secret serves it until its auth cache entry is 1 s old, then 401", async () => {
    const leases = store.kind === "postgres"; // the gateway's default: leases on PostgreSQL
    const a = await open({ authCacheTtlMs: 1000, leases, instanceId: "a" });
    const b = await open({ authCacheTtlMs: 1000, leases, instanceId: "b" });
    const { id, key } = await a.createKey({ budgetTokens: 1000 });
    const old = await b.authenticate(`Bearer ${key}`); // b caches the old secret (and, with leases, leases the key)
    const first = await b.placeHold(old, demand);
    if ("countNeeded" in first) throw new Error("unexpected");
    await b.settle(first.holdId, 4);
    const rotated = await a.rotateKey(id);
    expect((await refusal(() => a.authenticate(`Bearer ${key}`))).status).toBe(401); // at once where it rotated
    clock.now += 999;
    // b: its cache entry is younger than 1 s, so the old secret still passes and its Hold is placed
    // (from its lease on PostgreSQL: leases are the key id's, not the secret's).
    const still = await b.placeHold(await b.authenticate(`Bearer ${key}`), demand);
    if ("countNeeded" in still) throw new Error("unexpected");
    await b.settle(still.holdId, 4);
    clock.now += 1;
    expect((await refusal(() => b.authenticate(`Bearer ${key}`))).status).toBe(401);
    expect((await b.authenticate(`Bearer ${rotated.key}`)).id).toBe(id);
    await a.syncLeases();
    await b.syncLeases();
    expect((await a.usage(id)).spentTokens).toBe(8); // one key: both requests charged to it
  });

  it("an expired key: authenticate 401 naming the expiry; placeHold refuses it too", async () => {
    const ledger = await open();
    const expiresAt = clock.now + 1000;
    const { id, key } = await ledger.createKey({ budgetTokens: 100, expiresAt });
    const info = await ledger.authenticate(`Bearer ${key}`);
    clock.now = expiresAt;
    const r = await refusal(() => ledger.authenticate(`Bearer ${key}`));
    expect(r).toMatchObject({ code: "invalid_api_key", status: 401 });
    expect(r.message).toContain(`expired at ${new Date(expiresAt).toISOString()}`);
    expect(await refusal(() => ledger.placeHold(info, demand))).toMatchObject({ code: "invalid_api_key" });
    // The store refuses it as well: a KeyInfo read before an update set an expiry in the past.
    clock.now = expiresAt - 500;
    const later = await ledger.createKey({ budgetTokens: 100 });
    const laterInfo = await ledger.authenticate(`Bearer ${later.key}`);
    await ledger.updateKey(later.id, { expiresAt: clock.now - 1 });
    const s = await refusal(() => ledger.placeHold(laterInfo, demand));
    expect(s).toMatchObject({ code: "invalid_api_key", status: 401 });
    expect(s.message).toContain("expired at");
    expect((await ledger.usage(later.id)).openHolds).toBe(0);
    expect((await ledger.usage(id)).openHolds).toBe(0);
  });

  it("admin keys: their own prefix; each kind of key refused on the other's side (403), unknown 401", async () => {
    const ledger = await open();
    const admin = await ledger.createAdminKey({ name: "ops" });
    expect(admin.key).toMatch(/^acs-admin-[A-Za-z0-9_-]{43}$/);
    expect(admin.id).toMatch(/^adm_[0-9a-f]{12}$/);
    expect(await ledger.authenticateAdmin(`Bearer ${admin.key}`)).toEqual({
      id: admin.id,
      name: "ops",
      hint: `acs-admin-…${admin.key.slice(-4)}`,
      createdAt: clock.now,
      revokedAt: null,
    });
    const api = await ledger.createKey({ budgetTokens: 1 });
    expect(await refusal(() => ledger.authenticateAdmin(`Bearer ${api.key}`))).toMatchObject({
      code: "permission_denied",
      status: 403,
    });
    expect(await refusal(() => ledger.authenticate(`Bearer ${admin.key}`))).toMatchObject({
      code: "permission_denied",
      status: 403,
    });
    expect((await refusal(() => ledger.authenticateAdmin(undefined))).status).toBe(401);
    expect((await refusal(() => ledger.authenticateAdmin(`Bearer acs-admin-${"x".repeat(43)}`))).status).toBe(
      401,
    );
    expect((await refusal(() => ledger.authenticate(`Bearer acs-admin-${"x".repeat(43)}`))).status).toBe(401);
    await ledger.revokeAdminKey(admin.id);
    expect(await refusal(() => ledger.authenticateAdmin(`Bearer ${admin.key}`))).toMatchObject({
      code: "invalid_api_key",
      status: 401,
    });
    expect((await refusal(() => ledger.authenticate(`Bearer ${admin.key}`))).status).toBe(401);
    await ledger.revoke(api.id);
    expect((await refusal(() => ledger.authenticateAdmin(`Bearer ${api.key}`))).status).toBe(401);
  });

  it("every change is one audit row (actor, action, before, after), newest first, paged", async () => {
    const ledger: BudgetLedger = await open();
    const admin = await ledger.createAdminKey({ name: "ops" });
    clock.now += 1;
    const { id } = await ledger.createKey({ name: "a", budgetTokens: 10 }, admin.id);
    clock.now += 1;
    await ledger.updateKey(id, { metadata: { k: "v" } }, admin.id);
    clock.now += 1;
    await ledger.grant(id, 5);
    clock.now += 1;
    const rotated = await ledger.rotateKey(id, admin.id);
    clock.now += 1;
    await ledger.revoke(id, admin.id);
    await errorOf(() => ledger.updateKey(id, { budgetTokens: -1 }, admin.id)); // refused: no row
    const rows = [];
    let after: string | undefined;
    for (;;) {
      const page = await ledger.listAuditLogs({ limit: 2, ...(after === undefined ? {} : { after }) });
      rows.push(...page.items);
      if (!page.hasMore) break;
      after = page.items.at(-1)?.id;
    }
    expect(rows.map((r) => [r.actor, r.action, r.targetId])).toEqual([
      [admin.id, "api_key.revoked", id],
      [admin.id, "api_key.rotated", id],
      ["cli", "api_key.updated", id],
      [admin.id, "api_key.updated", id],
      [admin.id, "api_key.created", id],
      ["cli", "admin_key.created", admin.id],
    ]);
    const [revoked, rotation, granted, meta, created, adminCreated] = rows;
    expect(created?.before).toBeNull();
    expect(created?.after).toMatchObject({
      id,
      name: "a",
      budget_tokens: 10,
      metadata: null,
      revoked_at: null,
    });
    expect(meta?.before).toMatchObject({ metadata: null });
    expect(meta?.after).toMatchObject({ metadata: { k: "v" } });
    expect([granted?.before?.budget_tokens, granted?.after?.budget_tokens]).toEqual([10, 15]);
    expect(rotation?.after?.hint).toBe(`acs-…${rotated.key.slice(-4)}`);
    expect(rotation?.before?.hint).not.toBe(rotation?.after?.hint);
    expect([revoked?.before?.revoked_at, revoked?.after?.revoked_at]).toEqual([null, clock.now]);
    expect(adminCreated?.after).toMatchObject({ id: admin.id, name: "ops", hint: admin.hint });
    expect(JSON.stringify(rows)).not.toContain(rotated.key.slice(4, 40));
    // Append-only, whoever writes the database.
    await expect(rawExec(store, "UPDATE audit_logs SET actor = 'x'")).rejects.toThrow(/append-only/);
    await expect(rawExec(store, "DELETE FROM audit_logs")).rejects.toThrow(/append-only/);
    expect((await ledger.listAuditLogs({ limit: 100 })).items).toHaveLength(6);
  });
});
