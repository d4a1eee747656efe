/**
 * Benchmark of the Budget ledger on its real stores: a SQLite file in a temp dir, and PostgreSQL
 * (the machine's server, a fresh database; ACS_TEST_POSTGRES_URL overrides the admin URL) with and
 * without leases. Measures the latency a request pays for placeHold + settle, Holds per second
 * per replica with several processes on one store, and what the last 1% of a Budget costs.
 *
 *   npx tsx bench/budget.ts        prints the markdown section
 *   benchBudget()                  returns it (for bench/run.ts)
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Bench } from "tinybench";
import {
  type BudgetLedger,
  type BudgetLedgerOptions,
  createBudgetLedger,
  DEFAULT_LEASE_SETTINGS,
  isPostgresUrl,
  type KeyInfo,
} from "../src/budget/index.js";
import { testDatabase } from "../test/helpers/postgres.js";
import { track } from "./hotpath/processes.js";

const SELF = fileURLToPath(import.meta.url);
const WORKER_FLAG = "--budget-bench-worker";
const DEMAND = { promptTokens: 12, prompts: 1, n: 1, maxTokens: 256 } as const;
const NEED = DEMAND.promptTokens + DEMAND.maxTokens;

/** A store configuration measured: how to open it, by name. */
interface Setup {
  readonly name: string;
  readonly db: string;
  readonly extra: Partial<BudgetLedgerOptions>;
}

const open = (s: Setup, more: Partial<BudgetLedgerOptions> = {}) =>
  createBudgetLedger({
    ...(isPostgresUrl(s.db) ? { postgresUrl: s.db } : { path: s.db }),
    reclaimIntervalMs: 0,
    ...s.extra,
    ...more,
  } as BudgetLedgerOptions);

/** Runs the benchmark and returns a markdown section (`## Budget ledger …`). */
export async function benchBudget(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "acs-bench-budget-"));
  const pg = testDatabase("bench");
  await pg.create();
  try {
    const setups: Setup[] = [
      {
        name: "SQLite, synchronous=normal (default)",
        db: join(dir, "normal.db"),
        extra: { synchronous: "normal" },
      },
      { name: "SQLite, synchronous=full", db: join(dir, "full.db"), extra: { synchronous: "full" } },
    ];
    if (pg.skipReason === undefined) {
      setups.push(
        { name: "PostgreSQL, one transaction per Hold", db: pg.url, extra: { leases: false } },
        { name: "PostgreSQL, leases (default)", db: pg.url, extra: { leases: true } },
      );
    }
    const lines: string[] = [
      "## Budget ledger (src/budget): Hold + settle on SQLite and PostgreSQL",
      "",
      `Real stores: a SQLite file (WAL) in a temp dir; PostgreSQL 15 on 127.0.0.1 (the machine's server, a fresh database, default settings: synchronous_commit on). Node ${process.version}, ${availableParallelism()} CPUs shared with other jobs. Demand per request: ${DEMAND.promptTokens} prompt tokens + ${DEMAND.maxTokens} max_tokens. With leases a replica leases ${DEFAULT_LEASE_SETTINGS.share * 100}% of the key's free tokens and places Holds in memory; settles reach the store at the next lease sync (every ${DEFAULT_LEASE_SETTINGS.syncIntervalMs} ms).`,
      ...(pg.skipReason === undefined ? [] : ["", `PostgreSQL rows are missing: ${pg.skipReason}.`]),
      "",
      "Latency per call, one process, one connection (tinybench, median and p99):",
      "",
      "| operation | store | median µs | p99 µs | mean µs | ops/s (1 / mean) | samples |",
      "|---|---|---:|---:|---:|---:|---:|",
    ];
    for (const s of setups) {
      const ledger = await open(s, s.db === pg.url ? { poolSize: 1 } : {});
      try {
        for (const row of await latencyRows(ledger, s.name)) lines.push(row);
      } finally {
        await ledger.close();
      }
    }

    lines.push(
      "",
      "Holds/s with P processes (replicas) on one store, one key with headroom (each loops placeHold + settle for 3 s):",
      "",
      "| processes | store | holds/s (all) | holds/s per replica |",
      "|---:|---|---:|---:|",
    );
    for (const s of setups.filter((x) => !x.name.includes("full"))) {
      for (const processes of [1, 2, 4]) {
        const db = s.db === pg.url ? s.db : join(dir, `concurrent-${processes}.db`);
        const perProcess = await concurrentHolds({ ...s, db }, processes, 3000);
        const total = perProcess.reduce((sum, n) => sum + n, 0) / 3;
        lines.push(`| ${processes} | ${s.name} | ${fmt(total)} | ${fmt(total / processes)} |`);
      }
    }

    lines.push(
      "",
      "The last 1% of a Budget: a key with 1% of 10,000,000 tokens left, 2 replicas (processes) placing Holds of " +
        `${NEED} tokens and settling them whole until it is spent (near the end: one transaction per Hold, and each ` +
        "clamp or refusal first asks the other replica's lease to drain). Latency per placeHold + settle, and the 429 at the end:",
      "",
      "| store | Holds served | holds/s (both) | p50 µs | p99 µs | max µs | first 429 after (µs) |",
      "|---|---:|---:|---:|---:|---:|---:|",
    );
    for (const s of setups.filter((x) => !x.name.includes("full"))) {
      const db = s.db === pg.url ? s.db : join(dir, "last.db");
      lines.push(await lastPercent({ ...s, db }));
    }
    return `${lines.join("\n")}\n`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await pg.drop();
  }
}

async function latencyRows(ledger: BudgetLedger, store: string): Promise<string[]> {
  const { key } = await ledger.createKey({ name: "bench", budgetTokens: 1e15 });
  const header = `Bearer ${key}`;
  const info = await ledger.authenticate(header);
  const busy = await ledger.createKey({ name: "bench-busy", budgetTokens: 1e15 });
  const busyInfo = await ledger.authenticate(`Bearer ${busy.key}`);
  for (let i = 0; i < 1000; i++) await ledger.placeHold(busyInfo, DEMAND);
  const bench = new Bench({ time: 1500, warmup: true });
  bench
    .add("authenticate (key cached ≤ 1 s)", async () => {
      await ledger.authenticate(header);
    })
    .add("placeHold + settle", async () => {
      await ledger.settle((await ledger.placeHold(info, DEMAND)).holdId, 100);
    })
    .add("placeHold + settle, 1000 other Holds open on the key", async () => {
      await ledger.settle((await ledger.placeHold(busyInfo, DEMAND)).holdId, 100);
    });
  await bench.run();
  const rows: string[] = [];
  for (const task of bench.tasks) {
    const r = task.result;
    if (r.state !== "completed") {
      rows.push(`| ${task.name} | ${store} | failed (${r.state}) | | | | |`);
      continue;
    }
    rows.push(
      `| ${task.name} | ${store} | ${fmt(r.latency.p50 * 1000)} | ${fmt(r.latency.p99 * 1000)} | ` +
        `${fmt(r.period * 1000)} | ${fmt(1000 / r.period)} | ${r.latency.samplesCount} |`,
    );
  }
  return rows;
}

/** Starts worker processes on one store and key; resolves with each one's output line. */
async function runWorkers(
  s: Setup,
  key: string,
  processes: number,
  mode: string,
  arg: number,
): Promise<string[]> {
  const children = Array.from({ length: processes }, (_, i) =>
    track(
      spawn(
        process.execPath,
        [
          "--import",
          "tsx",
          SELF,
          WORKER_FLAG,
          s.db,
          key,
          mode,
          String(arg),
          JSON.stringify(s.extra),
          `w${i}`,
        ],
        { stdio: ["pipe", "pipe", "inherit"] },
      ),
    ),
  );
  const readers = children.map((child) => createInterface({ input: child.stdout })[Symbol.asyncIterator]());
  const next = async (reader: AsyncIterator<string>): Promise<string> => {
    const { value, done } = await reader.next();
    if (done === true) throw new Error("bench worker exited early");
    return value;
  };
  for (const reader of readers) await next(reader); // "ready"
  for (const child of children) child.stdin.end("go\n");
  return Promise.all(readers.map((reader) => next(reader)));
}

/** P processes loop placeHold + settle for durationMs; resolves with each one's count of cycles. */
async function concurrentHolds(s: Setup, processes: number, durationMs: number): Promise<number[]> {
  const admin = await open(s, { leases: false });
  const { key } = await admin.createKey({ name: "bench", budgetTokens: 1e15 });
  await admin.close();
  return (await runWorkers(s, key, processes, "loop", durationMs)).map(Number);
}

/** Two processes spend the last 1% of a Budget; one table row. */
async function lastPercent(s: Setup): Promise<string> {
  const budget = 10_000_000;
  const admin = await open(s, { leases: false });
  const { id, key } = await admin.createKey({ name: "last", budgetTokens: budget });
  const info = await admin.authenticate(`Bearer ${key}`);
  // Spend 99% in one go.
  await admin.settle(
    (await admin.placeHold(info, { promptTokens: 0, prompts: 1, n: 1, maxTokens: budget * 0.99 })).holdId,
    budget * 0.99,
  );
  const results = (await runWorkers(s, key, 2, "last", 0)).map(
    (line) => JSON.parse(line) as { latenciesUs: number[]; refusalUs: number; elapsedMs: number },
  );
  const usage = await admin.usage(id);
  await admin.close();
  const all = results.flatMap((r) => r.latenciesUs).sort((a, b) => a - b);
  const at = (q: number) => all[Math.min(all.length - 1, Math.floor(q * all.length))] ?? 0;
  const seconds = Math.max(...results.map((r) => r.elapsedMs)) / 1000;
  const refusal = Math.max(...results.map((r) => r.refusalUs));
  if (usage.spentTokens + usage.leasedTokens + usage.heldTokens > budget) throw new Error("overspent");
  return `| ${s.name} | ${all.length} | ${fmt(all.length / seconds)} | ${fmt(at(0.5))} | ${fmt(at(0.99))} | ${fmt(all.at(-1) ?? 0)} | ${fmt(refusal)} |`;
}

/** The worker: after "go", `loop` runs placeHold + settle for arg ms and prints its count; `last` spends the key. */
async function worker(db: string, key: string, mode: string, arg: number, extra: string, name: string) {
  const ledger = await open(
    { name, db, extra: JSON.parse(extra) as Partial<BudgetLedgerOptions> },
    { instanceId: name },
  );
  const info: KeyInfo = await ledger.authenticate(`Bearer ${key}`);
  process.stdout.write("ready\n");
  for await (const line of createInterface({ input: process.stdin })) if (line === "go") break;
  if (mode === "loop") {
    let count = 0;
    const end = performance.now() + arg;
    while (performance.now() < end) {
      await ledger.settle((await ledger.placeHold(info, DEMAND)).holdId, NEED);
      count++;
    }
    await ledger.close();
    process.stdout.write(`${count}\n`);
    return;
  }
  const latenciesUs: number[] = [];
  let refusalUs = 0;
  const start = performance.now();
  for (;;) {
    const t = performance.now();
    try {
      const hold = await ledger.placeHold(info, DEMAND);
      await ledger.settle(hold.holdId, hold.heldTokens);
      latenciesUs.push((performance.now() - t) * 1000);
    } catch {
      refusalUs = (performance.now() - t) * 1000;
      break;
    }
  }
  const elapsedMs = performance.now() - start;
  await ledger.close();
  process.stdout.write(`${JSON.stringify({ latenciesUs, refusalUs, elapsedMs })}\n`);
}

function fmt(x: number): string {
  return x >= 100 ? Math.round(x).toLocaleString("en-US") : x.toFixed(1);
}

if (process.argv[2] === WORKER_FLAG) {
  const [db = "", key = "", mode = "loop", arg = "0", extra = "{}", name = "w"] = process.argv.slice(3);
  await worker(db, key, mode, Number(arg), extra, name);
} else if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.stdout.write(await benchBudget());
}
