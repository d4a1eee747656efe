import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, beforeAll, beforeEach } from "vitest";
import {
  type BudgetLedger,
  type BudgetLedgerOptions,
  type BudgetStore,
  createBudgetLedger,
  createPostgresBudgetStore,
  createSqliteBudgetStore,
} from "../../src/budget/index.js";
import { testDatabase } from "../helpers/postgres.js";

/** The repository root (cwd of child processes). */
export const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** A fresh temp dir with a path for a SQLite file in it; `cleanup` removes the dir. */
export function tempDb(): { dir: string; path: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "acs-budget-"));
  return { dir, path: join(dir, "budget.db"), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Starts a TypeScript fixture in a real child process (node --import tsx). */
export function spawnFixture(file: string, args: readonly string[]): ChildProcess {
  return spawn(process.execPath, ["--import", "tsx", join(ROOT, "test/budget/fixtures", file), ...args], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
}

/**
 * Reads `child`'s stdout line by line: each call of the returned function resolves with the next
 * line, or rejects when the child exits first (with its stderr in the message).
 */
export function lineReader(child: ChildProcess): () => Promise<string> {
  const lines: string[] = [];
  const waiters: { resolve: (line: string) => void; reject: (err: Error) => void }[] = [];
  let stderr = "";
  let ended: Error | undefined;
  createInterface({ input: child.stdout! }).on("line", (line) => {
    const waiter = waiters.shift();
    if (waiter === undefined) lines.push(line);
    else waiter.resolve(line);
  });
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString("utf8");
  });
  child.on("close", (code, signal) => {
    ended = new Error(`child exited (${code ?? signal}); stderr: ${stderr}`);
    for (const waiter of waiters.splice(0)) waiter.reject(ended);
  });
  return () => {
    const line = lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    if (ended !== undefined) return Promise.reject(ended);
    return new Promise((resolve, reject) => waiters.push({ resolve, reject }));
  };
}

/** Resolves when `child` has exited, with its code and signal. */
export function exited(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  }
  return new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
}

/** A store every budget test file runs against: a SQLite file, or a PostgreSQL database. */
export interface StoreUnderTest {
  readonly kind: "sqlite" | "postgres";
  /** beforeAll: creates the PostgreSQL database of the file. */
  setup(): Promise<void>;
  /**
   * beforeEach: a fresh SQLite file, or the file's database emptied; skips the test (with the
   * reason) when PostgreSQL is unavailable.
   */
  fresh(ctx: { skip: (note?: string) => void }): Promise<void>;
  /** createBudgetLedger options that select the store. */
  options(): { path: string } | { postgresUrl: string };
  /** ACS_DB of the store (a path or a postgres:// URL), for child processes and the CLI. */
  acsDb(): string;
  /** afterEach: removes the SQLite file. */
  cleanup(): void;
  /** afterAll: drops the PostgreSQL database. */
  teardown(): Promise<void>;
}

/** The SQLite store and the PostgreSQL store, for `describe.each`. `label` names the database. */
export function storesUnderTest(label: string): StoreUnderTest[] {
  let file: ReturnType<typeof tempDb> | undefined;
  const sqlite: StoreUnderTest = {
    kind: "sqlite",
    async setup() {},
    async fresh() {
      file = tempDb();
    },
    options: () => ({ path: sqlitePath() }),
    acsDb: () => sqlitePath(),
    cleanup() {
      file?.cleanup();
      file = undefined;
    },
    async teardown() {},
  };
  const sqlitePath = () => {
    if (file === undefined) throw new Error("no SQLite file: call fresh() first");
    return file.path;
  };
  const database = testDatabase(label);
  const postgres: StoreUnderTest = {
    kind: "postgres",
    setup: () => database.create(),
    async fresh(ctx) {
      if (database.skipReason !== undefined) ctx.skip(database.skipReason);
      await database.truncate();
    },
    options: () => ({ postgresUrl: database.url }),
    acsDb: () => database.url,
    cleanup() {},
    teardown: () => database.drop(),
  };
  return [sqlite, postgres];
}

/** The test clock's start (Unix epoch ms) in {@link clockedLedgers}. */
const CLOCK_START = 1_900_000_000_000;

/**
 * Ledgers on `store` that read one test clock (`clock.now`, Unix epoch ms, moved by the test and
 * reset before each test): `open(extra)` opens one with `defaults` (no reclaim timer, no auth
 * cache) and closes it after the test; `rawStore()` opens a store of its own on the same
 * database, for a test to wrap. Registers the describe block's hooks (setup, a fresh database per
 * test, cleanup).
 */
export function clockedLedgers(store: StoreUnderTest, defaults: Partial<BudgetLedgerOptions>) {
  const ledgers: BudgetLedger[] = [];
  const clock = { now: CLOCK_START };
  beforeAll(() => store.setup());
  afterAll(() => store.teardown());
  beforeEach((ctx) => {
    clock.now = CLOCK_START;
    return store.fresh(ctx);
  });
  afterEach(async () => {
    for (const l of ledgers.splice(0)) await l.close().catch(() => undefined);
    store.cleanup();
  });
  const open = async (extra: Partial<BudgetLedgerOptions> = {}): Promise<BudgetLedger> => {
    const ledger = await createBudgetLedger({
      ...store.options(),
      reclaimIntervalMs: 0,
      authCacheTtlMs: 0,
      now: () => clock.now,
      ...defaults,
      ...extra,
    } as BudgetLedgerOptions);
    ledgers.push(ledger);
    return ledger;
  };
  const rawStore = async (): Promise<BudgetStore> => {
    const o = store.options();
    return "path" in o
      ? createSqliteBudgetStore({ path: o.path })
      : createPostgresBudgetStore({ url: o.postgresUrl });
  };
  return { clock, open, rawStore };
}
