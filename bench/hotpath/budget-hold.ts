/**
 * In-process bench of the SQLite ledger's per-request path (src/budget/): authenticate with a
 * cached key, placeHold + settle one transaction each (synchronous = NORMAL, WAL), one caller at a
 * time. Prints µs per call (tinybench mean and p50) and CPU µs per placeHold + settle.
 * Then 64 concurrent callers of placeHold + settle, on a store with group commit (the default:
 * the transactions of one event-loop turn share one COMMIT) and one with a COMMIT each, interleaved
 * over 3 rounds: pairs/s and CPU µs per pair.
 * Run: `npx tsx bench/hotpath/budget-hold.ts` (ACS_BENCH_MS: time per task, default 3000).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Bench } from "tinybench";
import { createBudgetLedger } from "../../src/budget/index.js";

const dir = mkdtempSync(join(tmpdir(), "acs-budget-hold-"));
const ledger = await createBudgetLedger({ path: join(dir, "b.db"), reclaimIntervalMs: 0 });
const { id, key } = await ledger.createKey({ budgetTokens: 1e15 });
const keyInfo = { id, name: "", models: null };
const header = `Bearer ${key}`;
const demand = { promptTokens: 10, prompts: 1, n: 1, maxTokens: 16 };
const time = Number(process.env.ACS_BENCH_MS ?? 3000);

const bench = new Bench({ time, warmupTime: 500 });
bench
  .add("authenticate (cached)", async () => {
    await ledger.authenticate(header);
  })
  .add("placeHold + settle", async () => {
    const h = await ledger.placeHold(keyInfo, demand);
    await ledger.settle(h.holdId, 12);
  });
await bench.run();
for (const t of bench.tasks) {
  const r = t.result;
  if (r === undefined || !("latency" in r)) continue;
  const l = r.latency;
  console.log(
    `${t.name}: mean ${(l.mean * 1000).toFixed(2)} µs, p50 ${(l.p50 * 1000).toFixed(2)} µs, p99 ${(l.p99 * 1000).toFixed(2)} µs`,
  );
}
const n = 20_000;
const cpu0 = process.cpuUsage();
for (let i = 0; i < n; i++) {
  const h = await ledger.placeHold(keyInfo, demand);
  await ledger.settle(h.holdId, 12);
}
const cpu = process.cpuUsage(cpu0);
console.log(
  `placeHold + settle: ${((cpu.user + cpu.system) / n).toFixed(1)} µs CPU (user ${(cpu.user / n).toFixed(1)}, sys ${(cpu.system / n).toFixed(1)})`,
);
await ledger.close();

/** 64 callers, each placeHold then (next turn) settle, 40,000 pairs in all, on a fresh store. */
async function concurrent(commit: "group" | "each"): Promise<string> {
  const path = join(dir, `c-${commit}-${Date.now()}.db`);
  const l = await createBudgetLedger({ path, reclaimIntervalMs: 0, leases: false, commit });
  const k = await l.createKey({ budgetTokens: 1e15 });
  const info = { id: k.id, name: "", models: null };
  const callers = 64;
  const pairs = 40_000;
  const caller = async () => {
    for (let i = 0; i < pairs / callers; i++) {
      const h = await l.placeHold(info, demand);
      await new Promise((r) => setImmediate(r)); // the request's upstream call in between
      await l.settle(h.holdId, 12);
    }
  };
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: callers }, caller));
  const wallMs = performance.now() - t0;
  const c = process.cpuUsage(c0);
  await l.close();
  return `${commit}: ${((pairs / wallMs) * 1000).toFixed(0)} pairs/s, ${((c.user + c.system) / pairs).toFixed(1)} µs CPU per pair (sys ${(c.system / pairs).toFixed(1)})`;
}
for (let round = 1; round <= 3; round++) {
  const order = round % 2 === 1 ? (["each", "group"] as const) : (["group", "each"] as const);
  const out: string[] = [];
  for (const commit of order) out.push(await concurrent(commit));
  console.log(`64 callers, round ${round}: ${out.join(" | ")}`);
}
rmSync(dir, { recursive: true, force: true });
