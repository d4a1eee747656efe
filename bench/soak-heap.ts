/**
 * Soak section `heap`: the gateway's heap after a full GC stays flat over 300,000 unauthenticated
 * requests (keys on, so each is a 401 refused before its body is read). A request that keeps even a
 * few bytes forever (e.g. a per-request signal tied to a process-long one with `AbortSignal.any`
 * on Node 20, nodejs/node#55351: ~64 B each, +19 MB over 300,000 requests) fails it.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import autocannon from "autocannon";
import { createBudgetLedger } from "../src/budget/index.js";
import { mib, startGatewayChild, startScriptedUpstream } from "./soak-gateway.js";

/** Requests between two readings. */
const STEP = Number(process.env.SOAK_HEAP_STEP ?? 100_000);
/** Readings after the baseline. */
const STEPS = 3;
/** Requests before the baseline (JIT, caches, pools settle). */
const WARMUP = 20_000;
/** Most heap growth, baseline to last reading, that still counts as flat, bytes. */
const FLAT_BYTES = 4 * 2 ** 20;

/** One section of `npm run soak`: its markdown and whether it passed. */
export interface SoakResult {
  readonly text: string;
  readonly ok: boolean;
}

export async function soakHeap(): Promise<SoakResult> {
  const dir = mkdtempSync(join(tmpdir(), "acs-soak-heap-"));
  const dbPath = join(dir, "acs.db");
  await (await createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 })).close(); // keys on, no key issued
  const upstream = await startScriptedUpstream();
  const gateway = await startGatewayChild(upstream.url, { ACS_DB: dbPath });
  const fire = async (amount: number) => {
    const result = await autocannon({
      url: `${gateway.url}/v1/completions`,
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "soak", prompt: "The sky is", max_tokens: 1 }),
      connections: 32,
      amount,
    });
    const unauthorized = result.statusCodeStats?.["401"]?.count ?? 0;
    return { unauthorized, others: amount - unauthorized, rps: result.requests.average };
  };
  try {
    await fire(WARMUP);
    const readings = [{ requests: 0, heapUsed: (await gateway.probe()).heapUsed, rps: 0, others: 0 }];
    for (let i = 1; i <= STEPS; i++) {
      const run = await fire(STEP);
      const { heapUsed } = await gateway.probe();
      readings.push({ requests: i * STEP, heapUsed, rps: run.rps, others: run.others });
    }
    const base = readings[0]!.heapUsed;
    const growth = readings[readings.length - 1]!.heapUsed - base;
    const wrong = readings.reduce((n, r) => n + r.others, 0);
    const ok = growth <= FLAT_BYTES && wrong === 0 && gateway.alive();
    const lines = [
      "## heap: heap after GC over unauthenticated requests",
      "",
      `The gateway (src/main.ts, keys on) in a child process with --expose-gc; ${WARMUP} requests of warm-up, then ${STEPS} × ${STEP} POST /v1/completions without a key (autocannon, 32 connections), each a 401; heap used after two full GCs (bench/heap-probe.ts). Flat: at most ${mib(FLAT_BYTES)} MiB of growth.`,
      "",
      "| requests | heap after GC MiB | Δ from 0 MiB | req/s | not 401 |",
      "|---:|---:|---:|---:|---:|",
      ...readings.map(
        (r) =>
          `| ${r.requests} | ${mib(r.heapUsed)} | ${mib(r.heapUsed - base)} | ${r.rps === 0 ? "—" : r.rps.toFixed(0)} | ${r.others} |`,
      ),
      "",
      `${ok ? "PASS" : "FAIL"}: ${mib(growth)} MiB of growth over ${STEPS * STEP} requests (${Math.max(0, growth / (STEPS * STEP)).toFixed(1)} B per request)${wrong > 0 ? `; ${wrong} answers were not 401` : ""}.`,
    ];
    return { text: lines.join("\n"), ok };
  } finally {
    await gateway.stop();
    await upstream.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
