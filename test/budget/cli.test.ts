import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { promisify } from "node:util";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createBudgetLedger, isPostgresUrl } from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { ROOT, storesUnderTest, tempDb } from "./helpers.js";

const run = promisify(execFile);

interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the CLI in a child process with the given ACS_DB, as `npm run keys:dev` does (`node --import tsx`). */
async function keys(args: readonly string[], acsDb: string | undefined): Promise<CliResult> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.ACS_DB;
  if (acsDb !== undefined) env.ACS_DB = acsDb;
  try {
    const argv = ["--import", "tsx", "src/budget/cli.ts", ...args];
    const { stdout, stderr } = await run(process.execPath, argv, { cwd: ROOT, env });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

const openLedger = (acsDb: string) =>
  createBudgetLedger({
    ...(isPostgresUrl(acsDb) ? { postgresUrl: acsDb } : { path: acsDb }),
    reclaimIntervalMs: 0,
    authCacheTtlMs: 0,
  });

describe.each(storesUnderTest("cli"))("npm run keys on $kind", (store) => {
  beforeAll(() => store.setup());
  afterAll(() => store.teardown());
  beforeEach((ctx) => store.fresh(ctx));
  afterEach(() => store.cleanup());

  it("create prints the key once; it authenticates; list, grant, usage and revoke work on it", async () => {
    const db = store.acsDb();
    const created = await keys(
      ["create", "--budget", "1000000", "--name", "alice", "--models", "llama-8b,tiny"],
      db,
    );
    expect(created.code).toBe(0);
    const key = created.stdout.match(/^acs-[A-Za-z0-9_-]{43}$/m)?.[0];
    const id = created.stdout.match(/key_[0-9a-f]{12}/)?.[0];
    expect(key).toBeDefined();
    expect(id).toBeDefined();

    const ledger = await openLedger(db);
    expect(await ledger.authenticate(`Bearer ${key}`)).toEqual({
      id,
      name: "alice",
      models: ["llama-8b", "tiny"],
      hint: `acs-…${key?.slice(-4)}`,
    });
    const info = await ledger.authenticate(`Bearer ${key}`);
    await ledger.settle(
      (await ledger.placeHold(info, { promptTokens: 5, prompts: 1, n: 1, maxTokens: 100 })).holdId,
      42,
    );
    await ledger.close();

    const list = await keys(["list"], db);
    expect(list.code).toBe(0);
    expect(list.stdout).toContain(id);
    expect(list.stdout).toContain("alice");
    expect(list.stdout).toContain(`acs-…${key!.slice(-4)}`);
    expect(list.stdout).not.toContain(key!.slice(4, 40));

    const granted = await keys(["grant", id!, "--tokens", "500", "--json"], db);
    expect(granted.code).toBe(0);
    expect(JSON.parse(granted.stdout)).toMatchObject({
      id,
      budgetTokens: 1_000_500,
      spentTokens: 42,
      availableTokens: 1_000_458,
    });

    const revoked = await keys(["revoke", id!], db);
    expect(revoked.code).toBe(0);
    expect(revoked.stdout).toMatch(/^Revoked key key_/);

    const usage = await keys(["usage", id!, "--db", db], undefined); // --db instead of ACS_DB
    expect(usage.code).toBe(0);
    expect(usage.stdout).toMatch(/state: +revoked/);
    expect(usage.stdout).toMatch(/budget: +1000500/);
    expect(usage.stdout).toMatch(/leased: +0 \(0 leases/);
    // Usage per UTC day: today's one request of 42 tokens.
    expect(usage.stdout).toMatch(new RegExp(`${new Date().toISOString().slice(0, 10)} +42 +1 +0`));
    const json = JSON.parse((await keys(["usage", id!, "--json", "--days", "1"], db)).stdout) as {
      daily: unknown[];
    };
    expect(json.daily).toEqual([
      { day: new Date().toISOString().slice(0, 10), chargedTokens: 42, settledHolds: 1, reclaimedHolds: 0 },
    ]);

    const after = await openLedger(db);
    await expect(after.authenticate(`Bearer ${key}`)).rejects.toThrow(ApiError);
    await after.close();
  });
});

describe.each(storesUnderTest("cliadmin"))(
  "npm run keys: key settings, admin keys and the audit log on $kind",
  (store) => {
    beforeAll(() => store.setup());
    afterAll(() => store.teardown());
    beforeEach((ctx) => store.fresh(ctx));
    afterEach(() => store.cleanup());

    it("create and update take --rpm, --tpm, --expires-at, --metadata; create-admin prints the admin key once; every change is audited as cli", async () => {
      const db = store.acsDb();
      const created = await keys(
        [
          "create",
          "--budget",
          "100",
          "--rpm",
          "60",
          "--tpm",
          "1000",
          "--expires-at",
          "2099-01-31T00:00:00Z",
        ].concat(["--metadata", "team=ml", "--metadata", "env=a=b", "--json"]),
        db,
      );
      expect(created.code).toBe(0);
      const key = JSON.parse(created.stdout) as { id: string; key: string };
      const ledger = await openLedger(db);
      try {
        expect(await ledger.getKey(key.id)).toMatchObject({
          budgetTokens: 100,
          rateLimits: { requestsPerMinute: 60, tokensPerMinute: 1000 },
          expiresAt: Date.parse("2099-01-31T00:00:00Z"),
          metadata: { team: "ml", env: "a=b" },
        });
        const updated = await keys(
          ["update", key.id, "--tpm", "none", "--budget", "50", "--expires-at", "never"],
          db,
        );
        expect(updated.code).toBe(0);
        expect(updated.stdout).toMatch(/^Updated key key_/);
        expect(updated.stdout).toContain("60 requests/min");
        expect(await ledger.getKey(key.id)).toMatchObject({
          budgetTokens: 50,
          rateLimits: { requestsPerMinute: 60 },
          expiresAt: null,
          metadata: { team: "ml", env: "a=b" },
        });
        expect((await ledger.getKey(key.id)).rateLimits).toEqual({ requestsPerMinute: 60 });
        const admin = await keys(["create-admin", "--name", "ops"], db);
        expect(admin.code).toBe(0);
        const secret = admin.stdout.match(/^acs-admin-[A-Za-z0-9_-]{43}$/m)?.[0];
        expect(secret).toBeDefined();
        expect((await ledger.authenticateAdmin(`Bearer ${secret}`)).name).toBe("ops");
        const rotated = await keys(["rotate", key.id], db);
        expect(rotated.code).toBe(0);
        const newKey = rotated.stdout.match(/^acs-[A-Za-z0-9_-]{43}$/m)?.[0];
        expect((await ledger.authenticate(`Bearer ${newKey}`)).id).toBe(key.id);
        const audit = await keys(["audit", "--json"], db);
        const rows = JSON.parse(audit.stdout) as { actor: string; action: string }[];
        expect(rows.map((r) => [r.actor, r.action])).toEqual([
          ["cli", "api_key.rotated"],
          ["cli", "admin_key.created"],
          ["cli", "api_key.updated"],
          ["cli", "api_key.created"],
        ]);
        expect((await keys(["audit"], db)).stdout).toMatch(/api_key\.rotated/);
        const low = await keys(["update", key.id, "--budget", "0", "--metadata", "none"], db);
        expect(low.code).toBe(0);
        const bad = await keys(["update", key.id, "--metadata", `${"k".repeat(65)}=v`], db);
        expect(bad).toMatchObject({ code: 1 });
        expect(bad.stderr).toMatch(/^error: A metadata key has 1 to 64 characters/);
      } finally {
        await ledger.close();
      }
    });
  },
);

let db: ReturnType<typeof tempDb>;
beforeEach(() => {
  db = tempDb();
});
afterEach(() => db.cleanup());

describe("npm run keys (src/budget/cli.ts)", () => {
  it("list --json gives every key without the key itself", async () => {
    await keys(["create", "--budget", "5"], db.path);
    await keys(["create", "--budget", "6", "--name", "b"], db.path);
    const list = await keys(["list", "--json"], db.path);
    const rows = JSON.parse(list.stdout) as Record<string, unknown>[];
    expect(rows.map((r) => r.budgetTokens)).toEqual([5, 6]);
    expect(rows.every((r) => !("key" in r) && !("keyHash" in r))).toBe(true);
  });

  it("create --period month: list, usage and --json show the period, its start and its reset", async () => {
    const created = await keys(["create", "--budget", "7000", "--period", "month"], db.path);
    expect(created.stdout).toMatch(/^Budget: 7000 tokens a month \(UTC\); models: all$/m);
    const id = created.stdout.match(/key_[0-9a-f]{12}/)?.[0] ?? "";
    const now = new Date();
    const start = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1);
    const resets = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1);
    expect((await keys(["list"], db.path)).stdout).toContain("7000/month");
    const usage = await keys(["usage", id], db.path);
    expect(usage.stdout).toMatch(/budget: +7000 a month/);
    expect(usage.stdout).toContain(
      `period:     from ${new Date(start).toISOString()}, resets at ${new Date(resets).toISOString()}`,
    );
    expect(JSON.parse((await keys(["usage", id, "--json"], db.path)).stdout)).toMatchObject({
      period: "month",
      periodStart: start,
      resetsAt: resets,
      periods: [],
    });
  });

  it.concurrent.each([
    [
      ["create", "--budget", "5", "--period", "year"],
      2,
      /--period must be one of none, day, week, month, got 'year'/,
    ],
    [["usage", "key_000000000000"], 1, /^error: No key with id 'key_000000000000'\./],
    [["grant", "key_000000000000", "--tokens", "5"], 1, /^error: No key with id/],
    [["create"], 2, /'create' needs --budget TOKENS/],
    [["create", "--budget", "1e6"], 2, /--budget must be a whole number of tokens/],
    [["create", "--budget", "-5"], 2, /--budget must be a whole number|error:/],
    [["grant", "key_000000000000"], 2, /'grant' needs --tokens N/],
    [["grant", "key_000000000000", "--tokens", "0"], 2, /--tokens must be a whole number of tokens ≥ 1/],
    [["revoke"], 2, /'revoke' takes the key id/],
    [["list", "--tokens", "5"], 2, /'list' has no option --tokens/],
    [["create", "--budget", "5", "--rpm", "0"], 2, /--rpm must be a whole number ≥ 1, got '0'/],
    [["create", "--budget", "5", "--rpm", "none"], 2, /--rpm must be a whole number/],
    [["create", "--budget", "5", "--expires-at", "soon"], 2, /--expires-at must be an ISO 8601 time/],
    [["create", "--budget", "5", "--metadata", "novalue"], 2, /--metadata takes KEY=VALUE/],
    [["update", "key_000000000000"], 2, /'update' needs something to change/],
    [["update", "key_000000000000", "--name", "x"], 1, /^error: No key with id/],
    [["audit", "--limit", "101"], 2, /--limit must be at most 100/],
    [["revoke-admin", "adm_000000000000"], 1, /^error: No admin key with id/],
    [["frobnicate"], 2, /unknown command 'frobnicate'/],
    [["list", "--bogus"], 2, /Unknown option '--bogus'/],
    [[], 2, /^error: no command/],
    // A database that cannot be opened: one line naming it (never its password), exit code 2.
    [
      ["usage", "key_000000000000", "--db", "/nonexistent/dir/x.db"],
      2,
      /^error: --db=\/nonexistent\/dir\/x\.db: the directory \/nonexistent\/dir does not exist\n$/,
    ],
    [
      ["list", "--db", "postgres://nobody:secret@127.0.0.1:1/acs"],
      2,
      /^error: --db=postgres:\/\/nobody:\*\*\*@127\.0\.0\.1:1\/acs: no PostgreSQL server answers at 127\.0\.0\.1:1 \(connection refused\)\n$/,
    ],

    [["usage", "key_000000000000", "--days", "0"], 2, /--days must be a whole number of days ≥ 1/],
  ])("%j exits %i with a clear error", async (args, code, message) => {
    const own = tempDb(); // concurrent cases: each its own file
    const result = await keys(args, own.path).finally(own.cleanup);
    expect(result.code).toBe(code);
    expect(result.stderr).toMatch(message);
  });

  it("a file that is not a database: one line, exit 2", async () => {
    const own = tempDb();
    writeFileSync(own.path, "not a SQLite file, only text ".repeat(8));
    const result = await keys(["list"], own.path).finally(own.cleanup);
    expect(result.code).toBe(2);
    expect(result.stderr).toBe(
      `error: ACS_DB=${own.path}: cannot open the SQLite file: file is not a database\n`,
    );
  });

  it("refuses to run without a database (exit 2)", async () => {
    const result = await keys(["list"], undefined);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(
      /set ACS_DB to the SQLite file or postgres:\/\/ URL, or pass --db PATH\|URL/,
    );
  });

  it("--help prints the usage and exits 0", async () => {
    const result = await keys(["--help"], undefined);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(/^Usage: npm run keys -- <command>/);
    expect(result.stdout).toContain("grant <id> --tokens N");
  });
});
