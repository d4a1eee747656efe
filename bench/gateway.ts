/**
 * Gateway benchmarks over real processes on loopback (autocannon in this process; the engine and
 * the gateway as separate processes, as in production):
 * - benchGateway: the same completions requests to the engine directly and through the gateway,
 *   non-stream and stream, at concurrency 1, 64 and 256: added latency p50/p99 (ms), throughput ratio.
 * - benchCapture: the added latency of a capture request (output_residual_stream: all 32 layers of
 *   the llama-8b preset) over the same request without capture, and over the engine's own capture.
 * - benchHoldOnRequest: the added latency of the Hold + settle (ACS_DB on) on a request.
 * Each returns a markdown section for bench/RESULTS.md.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import autocannon from "autocannon";
import { createBudgetLedger } from "../src/budget/index.js";
import { testDatabase } from "../test/helpers/postgres.js";
import { freePort, startTs, waitForOk } from "../test/helpers/processes.js";
import { track } from "./hotpath/processes.js";

const durationS = Number(process.env.BENCH_DURATION_S ?? 5);

/** An engine process and any number of gateway processes in front of it; stop() ends them all. */
async function startStack(preset: "tiny" | "llama-8b", gateways: Array<Record<string, string>>) {
  const dir = mkdtempSync(join(tmpdir(), "acs-bench-"));
  const enginePort = await freePort();
  const engineUrl = `http://127.0.0.1:${enginePort}`;
  const modelsFile = join(dir, "models.json");
  const [hidden, layers] = preset === "tiny" ? [64, 4] : [4096, 32];
  writeFileSync(
    modelsFile,
    JSON.stringify({
      models: [
        {
          id: "bench",
          upstream_url: engineUrl,
          served_model_name: preset === "tiny" ? "acs/tiny" : "meta-llama/Llama-3.1-8B",
          hidden_size: hidden,
          num_hidden_layers: layers,
        },
      ],
    }),
  );
  // Tracked: killed when the bench exits, however it exits (a SIGTERM to `npm run bench` too).
  const children = [
    track(startTs(["src/engine/main.ts", "--preset", preset, "--port", String(enginePort)], {})),
  ];
  const urls: string[] = [];
  for (const env of gateways) {
    const port = await freePort();
    urls.push(`http://127.0.0.1:${port}`);
    children.push(
      track(
        startTs(["src/main.ts"], {
          ACS_MODELS: modelsFile,
          PORT: String(port),
          ACS_LOG_LEVEL: "warn",
          ...env,
        }),
      ),
    );
  }
  await waitForOk(`${engineUrl}/health`, 60_000, 200);
  for (const url of urls) await waitForOk(`${url}/healthz`, 60_000, 200);
  return {
    dir,
    engineUrl,
    gatewayUrls: urls,
    stop() {
      for (const c of children) c.kill("SIGTERM");
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

interface Cell {
  p50: number;
  p99: number;
  rps: number;
  errors: number;
}

async function load(
  url: string,
  body: object,
  connections: number,
  opts: { duration?: number; headers?: Record<string, string> } = {},
): Promise<Cell> {
  const result = await autocannon({
    url: `${url}/v1/completions`,
    method: "POST",
    headers: { "content-type": "application/json", ...opts.headers },
    body: JSON.stringify(body),
    connections,
    duration: opts.duration ?? durationS,
  });
  return {
    p50: result.latency.p50,
    p99: result.latency.p99,
    rps: result.requests.average,
    errors: result.errors + result.non2xx,
  };
}

/** Warm-up (1 s), then the measured run. */
async function measure(url: string, body: object, connections: number, headers: Record<string, string> = {}) {
  await load(url, body, Math.min(connections, 8), { duration: 1, headers });
  return load(url, body, connections, { headers });
}

const machineNote =
  "engine and gateway in separate processes on the same 2-core machine, competing for CPU with autocannon";

/** Gateway vs engine, same requests. */
export async function benchGateway(): Promise<string> {
  const stack = await startStack("tiny", [{}]);
  const gateway = stack.gatewayUrls[0] as string;
  const lines = [
    "## Gateway vs engine (autocannon)",
    "",
    `Same request (tiny preset, prompt "The sky is", max_tokens 4, greedy) to the engine directly and through the gateway; ${durationS} s per cell after 1 s of warm-up; ${machineNote}.`,
    "",
    "| mode | connections | engine p50 / p99 ms | gateway p50 / p99 ms | added p50 / p99 ms | engine req/s | gateway req/s | throughput ratio | errors (e/g) |",
    "|---|---|---|---|---|---|---|---|---|",
  ];
  try {
    const base = { model: "bench", prompt: "The sky is", max_tokens: 4, temperature: 0, ignore_eos: true };
    for (const mode of ["non-stream", "stream"] as const) {
      const body = mode === "stream" ? { ...base, stream: true } : base;
      for (const connections of [1, 64, 256]) {
        const e = await measure(stack.engineUrl, { ...body, model: "acs/tiny" }, connections);
        const g = await measure(gateway, body, connections);
        lines.push(
          `| ${mode} | ${connections} | ${e.p50} / ${e.p99} | ${g.p50} / ${g.p99} | ${g.p50 - e.p50} / ${g.p99 - e.p99} | ${e.rps.toFixed(0)} | ${g.rps.toFixed(0)} | ${(g.rps / e.rps).toFixed(2)} | ${e.errors} / ${g.errors} |`,
        );
      }
    }
  } finally {
    stack.stop();
  }
  return lines.join("\n");
}

/** The added latency of capturing all 32 layers of the llama-8b preset. */
export async function benchCapture(): Promise<string> {
  const stack = await startStack("llama-8b", [{}]);
  const gateway = stack.gatewayUrls[0] as string;
  const base = { prompt: "The sky is", max_tokens: 4, temperature: 0, ignore_eos: true };
  try {
    const plain = await measure(gateway, { ...base, model: "bench" }, 1);
    const capture = await measure(gateway, { ...base, model: "bench", output_residual_stream: true }, 1);
    const captureStream = await measure(
      gateway,
      { ...base, model: "bench", output_residual_stream: true, stream: true },
      1,
    );
    const engineCapture = await measure(
      stack.engineUrl,
      {
        ...base,
        model: "meta-llama/Llama-3.1-8B",
        vllm_xargs: { output_residual_stream: JSON.stringify(Array.from({ length: 32 }, (_, i) => i)) },
      },
      1,
    );
    const row = (name: string, c: Cell) =>
      `| ${name} | ${c.p50} | ${c.p99} | ${c.rps.toFixed(1)} | ${c.errors} |`;
    return [
      "## Capture requests (llama-8b preset, 32 layers × 7 positions × 4096 = 917,504 numbers, ~1.8 MB bf16)",
      "",
      `Connections 1, ${durationS} s per row; ${machineNote}.`,
      "",
      "| request | p50 ms | p99 ms | req/s | errors |",
      "|---|---|---|---|---|",
      row("gateway, no capture", plain),
      row("engine, capture (vllm_xargs)", engineCapture),
      row("gateway, capture", capture),
      row("gateway, capture, stream (+1 prefill)", captureStream),
      "",
      `Added by capture through the gateway: p50 ${capture.p50 - plain.p50} ms over no capture, ${capture.p50 - engineCapture.p50} ms over the engine's own capture (the gateway's decode of Inference's JSON and re-encode of the tensor); a stream's capture costs one more prefill: p50 ${captureStream.p50 - capture.p50} ms over non-stream.`,
    ].join("\n");
  } finally {
    stack.stop();
  }
}

/**
 * One connection, rounds of one request to each gateway in turn (the order rotating each round),
 * timed with performance.now: the added latency of keys and Budgets as the median of each round's
 * difference (on − off), which a load that drifts during the run cancels out of. Markdown lines.
 */
async function pairedRounds(off: string, on: string[], keys: string[], body: object): Promise<string[]> {
  const rounds = Number(process.env.BENCH_HOLD_ROUNDS ?? 1000);
  const targets = [
    { url: off, headers: {} as Record<string, string> },
    ...on.map((url, i) => ({ url, headers: { authorization: `Bearer ${keys[i]}` } })),
  ];
  const once = async (t: (typeof targets)[number]): Promise<number> => {
    const start = performance.now();
    const res = await fetch(`${t.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...t.headers },
      body: JSON.stringify(body),
    });
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`bench request answered ${res.status}`);
    return (performance.now() - start) * 1000;
  };
  for (let i = 0; i < 50; i++) for (const t of targets) await once(t); // warm-up
  const times = targets.map(() => [] as number[]);
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < targets.length; k++) {
      const i = (r + k) % targets.length;
      (times[i] as number[]).push(await once(targets[i] as (typeof targets)[number]));
    }
  }
  const q = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.floor(p * (xs.length - 1))] ?? 0;
  const offTimes = times[0] as number[];
  const rows = [
    `${rounds} rounds of one request to each gateway in turn, one connection each, timed in the client (µs):`,
    "",
    "| store | off p50 µs | on p50 µs | added: median of per-round (on − off) µs | on p99 µs |",
    "|---|---:|---:|---:|---:|",
  ];
  for (const [i, url] of on.entries()) {
    void url;
    const onTimes = times[i + 1] as number[];
    const diffs = onTimes.map((t, r) => t - (offTimes[r] ?? 0));
    rows.push(
      `| ${i === 0 ? "SQLite (synchronous=normal)" : "PostgreSQL (leases)"} | ${Math.round(q(offTimes, 0.5))} | ${Math.round(q(onTimes, 0.5))} | ${Math.round(q(diffs, 0.5))} | ${Math.round(q(onTimes, 0.99))} |`,
    );
  }
  return rows;
}

/**
 * The added latency of the Hold + settle (keys and Budgets on) on a request: gateways without keys,
 * with SQLite, and (when the machine's PostgreSQL answers) with PostgreSQL and its leases.
 */
export async function benchHoldOnRequest(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "acs-bench-db-"));
  const dbPath = join(dir, "acs.db");
  const pg = testDatabase("bench_hold");
  await pg.create();
  const dbs = [dbPath, ...(pg.skipReason === undefined ? [pg.url] : [])];
  const keys: string[] = [];
  for (const db of dbs) {
    const ledger = await createBudgetLedger({
      ...(db === dbPath ? { path: db } : { postgresUrl: db }),
      reclaimIntervalMs: 0,
      leases: false,
    });
    keys.push((await ledger.createKey({ budgetTokens: 1_000_000_000 })).key);
    await ledger.close();
  }
  const stack = await startStack("tiny", [{}, ...dbs.map((db) => ({ ACS_DB: db }))]);
  const [off, ...on] = stack.gatewayUrls as [string, ...string[]];
  const body = { model: "bench", prompt: "The sky is", max_tokens: 1, temperature: 0 };
  const lines = [
    "## Hold + settle on a request (ACS_DB on vs off)",
    "",
    `Tiny preset, max_tokens 1, non-stream; gateways on one engine: one without keys, one with keys and Budgets on SQLite (synchronous=normal)${dbs.length > 1 ? ", one on PostgreSQL (leases)" : ""}; ${durationS} s per cell. autocannon reports whole milliseconds.${pg.skipReason === undefined ? "" : ` PostgreSQL row missing: ${pg.skipReason}.`}`,
    "",
  ];
  try {
    lines.push(...(await pairedRounds(off, on, keys, body)), "");
    lines.push(
      "autocannon, each gateway in turn:",
      "",
      "| store | connections | off p50 / p99 ms | on p50 / p99 ms | added p50 / p99 ms | off req/s | on req/s | errors (off/on) |",
      "|---|---|---|---|---|---|---|---|",
    );
    for (const connections of [1, 64]) {
      const a = await measure(off, body, connections);
      for (const [i, url] of on.entries()) {
        const b = await measure(url, body, connections, { authorization: `Bearer ${keys[i]}` });
        lines.push(
          `| ${i === 0 ? "SQLite" : "PostgreSQL"} | ${connections} | ${a.p50} / ${a.p99} | ${b.p50} / ${b.p99} | ${b.p50 - a.p50} / ${b.p99 - a.p99} | ${a.rps.toFixed(0)} | ${b.rps.toFixed(0)} | ${a.errors} / ${b.errors} |`,
        );
      }
    }
  } finally {
    stack.stop();
    rmSync(dir, { recursive: true, force: true });
    await new Promise((r) => setTimeout(r, 1000)); // the gateways close their connections
    await pg.drop();
  }
  return lines.join("\n");
}
