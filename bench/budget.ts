/**
 * Benchmark of the Budget ledger on a real SQLite file in a temp dir: the latency a request pays
 * for authenticate + placeHold + settle, and holds/s with several processes on one file.
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
import { type BudgetLedger, createBudgetLedger } from "../src/budget/index.js";

const SELF = fileURLToPath(import.meta.url);
const WORKER_FLAG = "--budget-bench-worker";
const DEMAND = { promptTokens: 12, prompts: 1, n: 1, maxTokens: 256 } as const;

/** Runs the benchmark and returns a markdown section (`## Budget ledger …`). */
export async function benchBudget(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "acs-bench-budget-"));
  try {
    const lines: string[] = [
      "## Budget ledger (src/budget): Hold + settle on SQLite",
      "",
      `Real SQLite file (WAL) in a temp dir; Node ${process.version}, ${availableParallelism()} CPUs. ` +
        `Demand per request: ${DEMAND.promptTokens} prompt tokens + ${DEMAND.maxTokens} max_tokens. ` +
        "Latency is per call in one process (tinybench, median and p99); one `placeHold + settle` is two " +
        "write transactions.",
      "",
      "| operation | synchronous | median µs | p99 µs | mean µs | ops/s (1 / mean) | samples |",
      "|---|---|---:|---:|---:|---:|---:|",
    ];
    for (const synchronous of ["full", "normal"] as const) {
      const path = join(dir, `latency-${synchronous}.db`);
      const ledger = createBudgetLedger({ path, synchronous, reclaimIntervalMs: 0 });
      try {
        for (const row of await latencyRows(ledger, synchronous)) lines.push(row);
      } finally {
        ledger.close();
      }
    }

    lines.push(
      "",
      "Holds/s with P processes on one file (each loops placeHold + settle for 2 s):",
      "",
      "| processes | synchronous | holds/s (all) | holds/s per process |",
      "|---:|---|---:|---:|",
    );
    for (const synchronous of ["full", "normal"] as const) {
      for (const processes of [1, 2, 4]) {
        const path = join(dir, `concurrent-${synchronous}-${processes}.db`);
        const perProcess = await concurrentHolds(path, synchronous, processes, 2000);
        const total = perProcess.reduce((s, n) => s + n, 0) / 2;
        lines.push(`| ${processes} | ${synchronous} | ${fmt(total)} | ${fmt(total / processes)} |`);
      }
    }
    return `${lines.join("\n")}\n`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function latencyRows(ledger: BudgetLedger, synchronous: string): Promise<string[]> {
  const { key } = ledger.createKey({ name: "bench", budgetTokens: 1e15 });
  const header = `Bearer ${key}`;
  const info = ledger.authenticate(header);
  const busy = ledger.createKey({ name: "bench-busy", budgetTokens: 1e15 });
  const busyInfo = ledger.authenticate(`Bearer ${busy.key}`);
  for (let i = 0; i < 1000; i++) ledger.placeHold(busyInfo, DEMAND);
  const bench = new Bench({ time: 1500, warmup: true });
  bench
    .add("authenticate", () => {
      ledger.authenticate(header);
    })
    .add("placeHold + settle", () => {
      ledger.settle(ledger.placeHold(info, DEMAND).holdId, 100);
    })
    .add("placeHold + settle, 1000 other Holds open on the key", () => {
      ledger.settle(ledger.placeHold(busyInfo, DEMAND).holdId, 100);
    });
  await bench.run();
  const rows: string[] = [];
  for (const task of bench.tasks) {
    const r = task.result;
    if (r.state !== "completed") {
      rows.push(`| ${task.name} | ${synchronous} | failed (${r.state}) | | | | |`);
      continue;
    }
    rows.push(
      `| ${task.name} | ${synchronous} | ${fmt(r.latency.p50 * 1000)} | ${fmt(r.latency.p99 * 1000)} | ` +
        `${fmt(r.period * 1000)} | ${fmt(1000 / r.period)} | ${r.latency.samplesCount} |`,
    );
  }
  return rows;
}

/** Starts `processes` workers on one file; resolves with each one's count of cycles. */
async function concurrentHolds(
  path: string,
  synchronous: "full" | "normal",
  processes: number,
  durationMs: number,
): Promise<number[]> {
  const admin = createBudgetLedger({ path, reclaimIntervalMs: 0 });
  const { key } = admin.createKey({ name: "bench", budgetTokens: 1e15 });
  admin.close();
  const children = Array.from({ length: processes }, () =>
    spawn(
      process.execPath,
      ["--import", "tsx", SELF, WORKER_FLAG, path, key, String(durationMs), synchronous],
      {
        stdio: ["pipe", "pipe", "inherit"],
      },
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
  return Promise.all(readers.map(async (reader) => Number(await next(reader))));
}

/** The worker: placeHold + settle in a loop for durationMs after "go"; prints its count. */
async function worker(path: string, key: string, durationMs: number, synchronous: string): Promise<void> {
  const ledger = createBudgetLedger({
    path,
    synchronous: synchronous === "normal" ? "normal" : "full",
    reclaimIntervalMs: 0,
  });
  const info = ledger.authenticate(`Bearer ${key}`);
  process.stdout.write("ready\n");
  for await (const line of createInterface({ input: process.stdin })) if (line === "go") break;
  let count = 0;
  const end = performance.now() + durationMs;
  while (performance.now() < end) {
    ledger.settle(ledger.placeHold(info, DEMAND).holdId, 100);
    count++;
  }
  ledger.close();
  process.stdout.write(`${count}\n`);
}

function fmt(x: number): string {
  return x >= 100 ? Math.round(x).toLocaleString("en-US") : x.toFixed(1);
}

if (process.argv[2] === WORKER_FLAG) {
  const [path = "", key = "", duration = "0", synchronous = "full"] = process.argv.slice(3);
  await worker(path, key, Number(duration), synchronous);
} else if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.stdout.write(await benchBudget());
}
