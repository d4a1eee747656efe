/**
 * In-process bench of the SQLite ledger's per-request path (src/budget/): authenticate with a
 * cached key, placeHold + settle one transaction each (synchronous = NORMAL, WAL), one caller at a
 * time. Prints µs per call (tinybench mean and p50) and CPU µs per placeHold + settle.
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
rmSync(dir, { recursive: true, force: true });
