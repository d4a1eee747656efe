/**
 * Gateway overhead: the same completions requests sent to the reference engine directly and
 * through the gateway, non-stream and stream, at concurrency 1, 64 and 256 (autocannon). Engine
 * and gateway run as separate processes (as in production), autocannon in this one.
 * `benchGateway()` returns a markdown section: latency p50/p99 (ms), requests/s, and the added
 * latency and throughput ratio of the gateway.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import autocannon from "autocannon";

const durationS = Number(process.env.BENCH_DURATION_S ?? 5);

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

async function waitFor(url: string, timeoutMs = 60_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${url} did not come up`);
}

function start(args: string[], env: Record<string, string>): ChildProcess {
  return spawn(process.execPath, ["--import", "tsx", ...args], {
    env: { ...process.env, ...env },
    stdio: "ignore",
  });
}

interface Row {
  target: string;
  mode: string;
  connections: number;
  p50: number;
  p99: number;
  rps: number;
  errors: number;
}

async function load(
  url: string,
  body: object,
  connections: number,
  duration = durationS,
): Promise<Omit<Row, "target" | "mode">> {
  const result = await autocannon({
    url: `${url}/v1/completions`,
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    connections,
    duration,
  });
  return {
    connections,
    p50: result.latency.p50,
    p99: result.latency.p99,
    rps: result.requests.average,
    errors: result.errors + result.non2xx,
  };
}

/** Runs the gateway-vs-engine benchmark; returns a markdown section. */
export async function benchGateway(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "acs-bench-"));
  const enginePort = await freePort();
  const gatewayPort = await freePort();
  const engineUrl = `http://127.0.0.1:${enginePort}`;
  const gatewayUrl = `http://127.0.0.1:${gatewayPort}`;
  const modelsFile = join(dir, "models.json");
  writeFileSync(
    modelsFile,
    JSON.stringify({
      models: [
        { id: "acs/tiny", aliases: ["tiny"], upstream_url: engineUrl, hidden_size: 64, num_hidden_layers: 4 },
      ],
    }),
  );
  const engine = start(["src/engine/main.ts", "--preset", "tiny", "--port", String(enginePort)], {});
  const gateway = start(["src/main.ts"], {
    ACS_MODELS: modelsFile,
    PORT: String(gatewayPort),
    ACS_LOG_LEVEL: "warn",
  });
  const rows: Row[] = [];
  try {
    await waitFor(`${engineUrl}/health`);
    await waitFor(`${gatewayUrl}/healthz`);
    const base = { model: "acs/tiny", prompt: "The sky is", max_tokens: 4, temperature: 0, ignore_eos: true };
    for (const mode of ["non-stream", "stream"] as const) {
      const body = mode === "stream" ? { ...base, stream: true } : base;
      for (const connections of [1, 64, 256]) {
        for (const [target, url] of [
          ["engine", engineUrl],
          ["gateway", gatewayUrl],
        ] as const) {
          await load(url, body, Math.min(connections, 8), 1); // warm-up
          rows.push({ target, mode, ...(await load(url, body, connections)) });
        }
      }
    }
  } finally {
    engine.kill("SIGTERM");
    gateway.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
  const lines = [
    "## Gateway vs engine (autocannon)",
    "",
    `Same request (tiny preset, prompt "The sky is", max_tokens 4, greedy) to the engine directly and through the gateway; ${durationS} s per cell; engine and gateway in separate processes on the same 2-core machine, so both compete for CPU with autocannon.`,
    "",
    "| mode | connections | engine p50 / p99 ms | gateway p50 / p99 ms | added p50 / p99 ms | engine req/s | gateway req/s | throughput ratio | errors (e/g) |",
    "|---|---|---|---|---|---|---|---|---|",
  ];
  for (let i = 0; i < rows.length; i += 2) {
    const e = rows[i] as Row;
    const g = rows[i + 1] as Row;
    lines.push(
      `| ${e.mode} | ${e.connections} | ${e.p50} / ${e.p99} | ${g.p50} / ${g.p99} | ${g.p50 - e.p50} / ${g.p99 - e.p99} | ${e.rps.toFixed(0)} | ${g.rps.toFixed(0)} | ${(g.rps / e.rps).toFixed(2)} | ${e.errors} / ${g.errors} |`,
    );
  }
  return lines.join("\n");
}
