// The admin API over REST (proto/API.md §11) through the real gateway and engine, on SQLite and
// PostgreSQL: each route's answer and refusals (401, 403 both ways, 404, 400 with param), rotate,
// revoke, expiry, pages, the audit rows of the actions, and every answer against /openapi.json.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { BudgetLedger } from "../../src/budget/index.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { testDatabase } from "../helpers/postgres.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

afterEach(assertConforming);

type Json = Record<string, unknown>;

/** One REST call: its status and JSON body. */
async function call(
  stack: Stack,
  method: string,
  path: string,
  authorization: string | undefined,
  body?: unknown,
): Promise<{ status: number; json: Json }> {
  const res = await checkedFetch(`${stack.url}${path}`, {
    method,
    headers: {
      ...(authorization === undefined ? {} : { authorization }),
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
  });
  return { status: res.status, json: (await res.json()) as Json };
}

const errorOf = (json: Json) => json.error as { code: string; param: string | null; message: string };

const stores = [
  { kind: "sqlite" as const, database: undefined },
  { kind: "postgres" as const, database: testDatabase("adminrest") },
];

describe.each(stores)("the admin API on $kind", ({ kind, database }) => {
  let stack: Stack;
  let dir: string;
  let admin: string;
  let adminId: string;
  const ledger = (): BudgetLedger => {
    if (stack.ledger === undefined) throw new Error("no ledger");
    return stack.ledger;
  };
  const as = (method: string, path: string, body?: unknown) =>
    call(stack, method, path, `Bearer ${admin}`, body);

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "acs-admin-"));
    if (database !== undefined) {
      await database.create();
      if (database.skipReason !== undefined) return;
    }
    stack = await startStack(
      kind === "sqlite"
        ? { dbPath: join(dir, "acs.db") }
        : { db: { kind: "postgres", url: database?.url ?? "" } },
    );
    const created = await ledger().createAdminKey({ name: "ops" });
    admin = created.key;
    adminId = created.id;
  });
  beforeEach(({ skip }) => {
    if (database?.skipReason !== undefined) skip(database.skipReason);
  });
  afterAll(async () => {
    await stack?.close();
    await database?.drop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("create → the key with its id and secret once; get, update, list; the secret serves completions", async () => {
    const created = await as("POST", "/v1/admin/keys", {
      name: "team",
      budget_tokens: 1000,
      models: ["tiny"],
      rate_limits: { requests_per_minute: 60, tokens_per_minute: 5000 },
      expires_at: null,
      metadata: { team: "ml" },
    });
    expect(created.status).toBe(200);
    const id = created.json.id as string;
    const key = created.json.key as string;
    expect(created.json).toMatchObject({
      object: "api_key",
      name: "team",
      budget_tokens: 1000,
      spent_tokens: 0,
      models: ["tiny"],
      rate_limits: { requests_per_minute: 60, tokens_per_minute: 5000 },
      expires_at: null,
      metadata: { team: "ml" },
      revoked_at: null,
      hint: `acs-…${key.slice(-4)}`,
    });
    const got = await as("GET", `/v1/admin/keys/${id}`);
    expect(got.status).toBe(200);
    const { key: _secret, ...withoutSecret } = created.json;
    expect(got.json).toEqual(withoutSecret);
    const completion = await call(stack, "POST", "/v1/completions", `Bearer ${key}`, {
      model: "tiny",
      prompt: "Hi",
      max_tokens: 2,
    });
    expect(completion.status).toBe(200);
    await ledger().syncLeases(); // PostgreSQL: the lease's charges reach the key row
    const updated = await as("POST", `/v1/admin/keys/${id}`, {
      name: "renamed",
      add_budget_tokens: 10,
      rate_limits: null,
      metadata: { team: "ml", env: "prod" },
    });
    expect(updated.status).toBe(200);
    expect(updated.json).toMatchObject({
      name: "renamed",
      budget_tokens: 1010,
      rate_limits: null,
      models: ["tiny"],
      metadata: { team: "ml", env: "prod" },
    });
    expect((updated.json.spent_tokens as number) > 0).toBe(true);
  });

  it("refusals: 401 without or with an unknown admin key, 403 for an API key (and an admin key on completions), 404 unknown id", async () => {
    const { key } = await ledger().createKey({ budgetTokens: 10 });
    const none = await call(stack, "GET", "/v1/admin/keys", undefined);
    expect(none.status).toBe(401);
    expect(errorOf(none.json).code).toBe("invalid_api_key");
    const unknown = await call(stack, "GET", "/v1/admin/keys", `Bearer acs-admin-${"A".repeat(43)}`);
    expect(unknown.status).toBe(401);
    const apiKey = await call(stack, "POST", "/v1/admin/keys", `Bearer ${key}`, { budget_tokens: 1 });
    expect(apiKey.status).toBe(403);
    expect(errorOf(apiKey.json).code).toBe("permission_denied");
    const onCompletions = await call(stack, "POST", "/v1/completions", `Bearer ${admin}`, {
      model: "tiny",
      prompt: "Hi",
      max_tokens: 1,
    });
    expect(onCompletions.status).toBe(403);
    expect(errorOf(onCompletions.json).code).toBe("permission_denied");
    const models = await call(stack, "GET", "/v1/models", `Bearer ${admin}`);
    expect(models.status).toBe(403);
    for (const [method, path] of [
      ["GET", "/v1/admin/keys/key_000000000000"],
      ["POST", "/v1/admin/keys/key_000000000000"],
      ["POST", "/v1/admin/keys/key_000000000000/rotate"],
      ["POST", "/v1/admin/keys/key_000000000000/revoke"],
    ] as const) {
      const r = await as(method, path, method === "POST" ? {} : undefined);
      expect(r.status, `${method} ${path}`).toBe(404);
      expect(errorOf(r.json)).toMatchObject({ code: "key_not_found", param: "id" });
    }
    const wrongMethod = await call(stack, "DELETE", "/v1/admin/keys", `Bearer ${admin}`);
    expect(wrongMethod.status).toBe(405);
  });

  it("400 with the param: strict decoding (unknown fields, types, duplicate keys) and the settings' caps", async () => {
    const cases: Array<[unknown, string | null]> = [
      [{ budget_tokens: 1, colour: "red" }, "colour"],
      [{ budget_tokens: "1" }, "budget_tokens"],
      [{ budget_tokens: 1.5 }, "budget_tokens"],
      [{ budget_tokens: -1 }, "budget_tokens"],
      [{ models: "tiny" }, "models"],
      [{ models: [""] }, "models"],
      [{ rate_limits: { requests_per_minute: 0 } }, "rate_limits.requests_per_minute"],
      [{ rate_limits: { rpm: 5 } }, "rate_limits.rpm"],
      [
        { rate_limits: { models: { tiny: { tokens_per_minute: "5" } } } },
        "rate_limits.models.tiny.tokens_per_minute",
      ],
      [{ metadata: { k: 5 } }, "metadata.k"],
      [{ metadata: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"])) }, "metadata"],
      [{ metadata: { k: "v".repeat(513) } }, "metadata"],
      [{ expires_at: "tomorrow" }, "expires_at"],
      ['{"budget_tokens": 1, "budget_tokens": 2}', null],
      ["[1]", null],
    ];
    for (const [body, param] of cases) {
      const r = await as("POST", "/v1/admin/keys", body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(errorOf(r.json), JSON.stringify(body)).toMatchObject({ code: "invalid_request", param });
    }
    const { id } = await ledger().createKey({ budgetTokens: 10 });
    const update = await as("POST", `/v1/admin/keys/${id}`, { add_budget_tokens: 0 });
    expect(errorOf(update.json)).toMatchObject({ code: "invalid_request", param: "add_budget_tokens" });
    const rotate = await as("POST", `/v1/admin/keys/${id}/rotate`, { now: true });
    expect(errorOf(rotate.json)).toMatchObject({ code: "invalid_request", param: "now" });
    const page = await as("GET", "/v1/admin/keys?limit=0");
    expect(errorOf(page.json)).toMatchObject({ code: "invalid_request", param: "limit" });
    const cursor = await as("GET", "/v1/admin/keys?after=key_000000000000");
    expect(errorOf(cursor.json)).toMatchObject({ code: "invalid_request", param: "after" });
    const query = await as("GET", "/v1/admin/keys?order=asc");
    expect(errorOf(query.json)).toMatchObject({ code: "invalid_request", param: "order" });
    const text = await call(stack, "POST", "/v1/admin/keys", `Bearer ${admin}`, undefined);
    expect(text.status).toBe(200); // no body: a key with a Budget of 0
    expect(text.json.budget_tokens).toBe(0);
  });

  it("rotate: the old secret 401 at once, the new one serves, same id and spent; revoke: 401", async () => {
    const created = await as("POST", "/v1/admin/keys", { budget_tokens: 1000 });
    const id = created.json.id as string;
    const old = created.json.key as string;
    const small = { model: "tiny", prompt: "Hi", max_tokens: 2 };
    expect((await call(stack, "POST", "/v1/completions", `Bearer ${old}`, small)).status).toBe(200);
    await ledger().syncLeases();
    const spent = (await as("GET", `/v1/admin/keys/${id}`)).json.spent_tokens;
    const rotated = await as("POST", `/v1/admin/keys/${id}/rotate`);
    expect(rotated.status).toBe(200);
    expect(rotated.json).toMatchObject({ id, spent_tokens: spent, budget_tokens: 1000 });
    const fresh = rotated.json.key as string;
    expect(fresh).not.toBe(old);
    expect((await call(stack, "POST", "/v1/completions", `Bearer ${old}`, small)).status).toBe(401);
    expect((await call(stack, "POST", "/v1/completions", `Bearer ${fresh}`, small)).status).toBe(200);
    const revoked = await as("POST", `/v1/admin/keys/${id}/revoke`, {});
    expect(revoked.status).toBe(200);
    expect(typeof revoked.json.revoked_at).toBe("number");
    const after = await call(stack, "POST", "/v1/completions", `Bearer ${fresh}`, small);
    expect(after.status).toBe(401);
    expect(errorOf(after.json).message).toContain("has been revoked");
  });

  it("an expired key gets 401 naming its expiry", async () => {
    const expiresAt = Date.now() + 400;
    const created = await as("POST", "/v1/admin/keys", { budget_tokens: 100, expires_at: expiresAt });
    const key = created.json.key as string;
    await new Promise((r) => setTimeout(r, Math.max(0, expiresAt - Date.now()) + 1100)); // past the auth cache
    const r = await call(stack, "POST", "/v1/completions", `Bearer ${key}`, {
      model: "tiny",
      prompt: "Hi",
      max_tokens: 1,
    });
    expect(r.status).toBe(401);
    expect(errorOf(r.json)).toMatchObject({ code: "invalid_api_key" });
    expect(errorOf(r.json).message).toContain(`expired at ${new Date(expiresAt).toISOString()}`);
  });

  it("pages keys and audit rows newest first over more than one page; the audit rows are the actions", async () => {
    const before = (await as("GET", "/v1/admin/audit_logs?limit=1")).json.first_id as string;
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push(
        (await as("POST", "/v1/admin/keys", { name: `page-${i}`, budget_tokens: i })).json.id as string,
      );
    }
    await as("POST", `/v1/admin/keys/${ids[0]}`, { metadata: { a: "b" } });
    await as("POST", `/v1/admin/keys/${ids[1]}/revoke`);
    const seen: string[] = [];
    let after: string | undefined;
    let pages = 0;
    for (;;) {
      const page = await as("GET", `/v1/admin/keys?limit=2${after === undefined ? "" : `&after=${after}`}`);
      expect(page.json).toMatchObject({ object: "list" });
      const data = page.json.data as Json[];
      seen.push(...data.map((k) => k.id as string));
      expect(page.json.first_id).toBe(data[0]?.id ?? null);
      pages++;
      if (page.json.has_more !== true) break;
      after = page.json.last_id as string;
    }
    expect(pages).toBeGreaterThan(2);
    const mine = seen.filter((id) => ids.includes(id));
    expect(mine).toEqual([...ids].reverse());
    const rows: Json[] = [];
    after = undefined;
    for (;;) {
      const page = await as(
        "GET",
        `/v1/admin/audit_logs?limit=3${after === undefined ? "" : `&after=${after}`}`,
      );
      const data = page.json.data as Json[];
      const stop = data.findIndex((r) => r.id === before);
      rows.push(...(stop < 0 ? data : data.slice(0, stop)));
      if (stop >= 0 || page.json.has_more !== true) break;
      after = page.json.last_id as string;
    }
    expect(rows.map((r) => [r.actor, r.action, r.target_id])).toEqual([
      [adminId, "api_key.revoked", ids[1]],
      [adminId, "api_key.updated", ids[0]],
      ...[...ids].reverse().map((id) => [adminId, "api_key.created", id]),
    ]);
    const revoke = rows[0] as { before: Json; after: Json };
    expect(revoke.before.revoked_at).toBeNull();
    expect(typeof revoke.after.revoked_at).toBe("number");
    expect(rows[1]).toMatchObject({ before: { metadata: null }, after: { metadata: { a: "b" } } });
    expect(rows.at(-1)).toMatchObject({
      object: "audit_log",
      before: null,
      after: { name: "page-0", budget_tokens: 0 },
    });
  });
});

describe("the admin API without keys", () => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack({});
  });
  afterAll(() => stack.close());

  it("answers 404 unknown_route saying the gateway runs without keys", async () => {
    const r = await call(stack, "GET", "/v1/admin/keys", "Bearer acs-admin-x");
    expect(r.status).toBe(404);
    expect(errorOf(r.json)).toMatchObject({ code: "unknown_route" });
    expect(errorOf(r.json).message).toContain("runs without keys");
  });
});
