/**
 * `npm run bench -- streams`: many concurrent SSE streams through the gateway (proto/API.md §5),
 * each of which must get every chunk and `data: [DONE]`.
 *
 * 1. N streams (default 10,000) through the gateway as production runs it with `ACS_WORKERS`
 *    processes (default: the cores available): failures, peak RSS summed over all the gateway's
 *    processes, and `GET /healthz` latency (a new connection every 100 ms) while the streams run,
 *    also split by phase: during the ramp, and while all N are open at once.
 * 2. M streams (default 5,000) through one gateway process (`ACS_WORKERS=1`) and through the bare
 *    proxy (../hotpath/bare-proxy.ts, its pool opened to 16,384 connections like the gateway's):
 *    memory per stream (peak RSS − RSS before, ÷ M, KiB) and the gaps between consecutive chunks
 *    of a stream (p50/p99) next to the fake's own spacing, CPU per stream, and `/healthz` (each
 *    answers its own) by phase: the same ramp rate as part 1 on one process, side by side.
 *
 * Processes, all on 127.0.0.1: the bench's fast fake vLLM (../hotpath/fake-vllm.ts; C chunks per
 * stream, one every D ms), the target, and the clients: ⌈streams / 2,500⌉ processes
 * (./stream-client.ts), one connection per stream, because a process may hold only so many sockets
 * (`ulimit -n`; a stream holds two sockets in the gateway as well, hence the workers). Streams are
 * opened evenly over a ramp shorter than a stream, so all are open at once for a while; the peak of
 * streams open at once is reported.
 *
 * Environment (for a quick check, e.g. `BENCH_STREAMS=1000 BENCH_STREAMS_ONE=500 npm run bench --
 * streams`): BENCH_STREAMS (10000), BENCH_STREAMS_ONE (5000; 0 skips part 2), BENCH_STREAMS_CHUNKS
 * (30), BENCH_STREAMS_CHUNK_MS (1000), BENCH_STREAMS_RAMP_S (N / 1,000, at least 3),
 * BENCH_STREAMS_PER_CLIENT (2500), BENCH_STREAMS_PRIME_S (10: seconds of one-token streams through
 * each target first, unmeasured), ACS_WORKERS (the gateway's processes in part 1),
 * BENCH_GATEWAY_CMD (as the hotpath section).
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { get } from "node:http";
import { availableParallelism, cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort } from "../../test/helpers/processes.js";
import { gatewayCommand } from "../hotpath/hotpath.js";
import { startLoadWorker } from "../hotpath/load-worker.js";
import { processCpuSeconds, type ServerProcess, spawnServer } from "../hotpath/processes.js";
import { type StreamClient, type StreamReport, startStreamClient } from "./stream-client.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const TSX = [process.execPath, "--import", "tsx"];
const MODEL = "bench-model";

function envInt(name: string, fallback: number): number {
  const v = process.env[name];
  if (v === undefined || v === "") return fallback;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got ${v}`);
  return n;
}

/** RSS of a process, bytes (/proc/<pid>/status VmRSS); 0 once it is gone. */
function rssBytes(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** A process and all its descendants (/proc/<pid>/task/<tid>/children). */
function processTree(pid: number): number[] {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    const p = out[i] as number;
    try {
      for (const tid of readdirSync(`/proc/${p}/task`)) {
        const kids = readFileSync(`/proc/${p}/task/${tid}/children`, "utf8").trim();
        if (kids !== "") out.push(...kids.split(/\s+/).map(Number));
      }
    } catch {}
  }
  return out;
}

const treeRss = (pid: number) => processTree(pid).reduce((a, p) => a + rssBytes(p), 0);

/** CPU seconds (user + system) used so far by a process and its descendants alive now. */
const treeCpuSeconds = (pid: number) =>
  processTree(pid).reduce((a, p) => {
    try {
      return a + processCpuSeconds(p);
    } catch {
      return a; // gone meanwhile
    }
  }, 0);

/** The q-quantile of a histogram of [value, count]. */
function quantile(hist: ReadonlyArray<readonly [number, number]>, q: number): number {
  const sorted = [...hist].sort((a, b) => a[0] - b[0]);
  const total = sorted.reduce((a, [, n]) => a + n, 0);
  if (total === 0) return Number.NaN;
  let seen = 0;
  for (const [v, n] of sorted) {
    seen += n;
    if (seen >= q * total) return v;
  }
  return (sorted.at(-1) as [number, number])[0];
}

function merge(hists: ReadonlyArray<ReadonlyArray<readonly [number, number]>>): Array<[number, number]> {
  const m = new Map<number, number>();
  for (const h of hists) for (const [v, n] of h) m.set(v, (m.get(v) ?? 0) + n);
  return [...m];
}

/** One `GET /healthz` on a new connection: latency in ms, or NaN when it failed. */
function healthz(url: string): Promise<number> {
  return new Promise((resolve) => {
    const t = performance.now();
    const req = get(`${url}/healthz`, { agent: false }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode === 200 ? performance.now() - t : Number.NaN));
    });
    req.on("error", () => resolve(Number.NaN));
  });
}

/** `/healthz` probes of one URL during a run, ms: all, by phase, and how many failed. */
interface HealthProbes {
  all: number[];
  ramp: number[];
  allOpen: number[];
  failed: number;
}

interface RunResult {
  streams: number;
  ok: number;
  failures: Record<string, number>;
  peakOpen: number;
  rssBeforeBytes: number;
  rssPeakBytes: number;
  processes: number;
  gaps: Array<[number, number]>;
  firstChunk: Array<[number, number]>;
  healthMs: number[];
  healthFailed: number;
  /** The probes that started while all `streams` were open at once (after the ramp), ms. */
  healthAllOpenMs: number[];
  /** The probes that started during the ramp (streams still being opened), ms. */
  healthRampMs: number[];
  /** The same probes on the gateway's ops port (ACS_OPS_PORT), when it has one. */
  ops: HealthProbes | undefined;
  seconds: number;
  /** CPU seconds the target's processes used from the first stream opened to the last one ended. */
  cpuSeconds: number;
}

interface RunSettings {
  streams: number;
  /** REST's SSE (default), or Connect server streams ({@link StreamJob.protocol}). */
  protocol?: "rest" | "connect";
  /** Seconds of unmeasured load first ({@link prime}). */
  primeS: number;
  chunks: number;
  rampMs: number;
  perClient: number;
}

/**
 * Loads `target` for `seconds` with one-token streams (64 connections, autocannon in a process of
 * its own), unmeasured, as the hotpath section primes its targets: a production process has run
 * for hours, and V8 optimizes a large code base over seconds of load, in every worker. A
 * one-token stream is the whole request path of a stream with no chunk delay (the fake spaces
 * only the chunks after the first).
 */
async function prime(target: ServerProcess, seconds: number): Promise<void> {
  if (seconds <= 0) return;
  const worker = await startLoadWorker();
  try {
    await worker.run({
      url: target.url,
      headers: {},
      body: JSON.stringify({ model: MODEL, prompt: "The sky is", max_tokens: 1, stream: true }),
      connections: 64,
      warmupS: 0,
      measureS: seconds,
      cpuPids: [],
    });
  } finally {
    worker.close();
  }
}

/** Runs `s.streams` streams against `target`, sampling its process tree's RSS and /healthz. */
async function runStreams(
  target: ServerProcess,
  s: RunSettings,
  health: boolean,
  opsUrl?: string,
): Promise<RunResult> {
  const body = JSON.stringify({ model: MODEL, prompt: "The sky is", max_tokens: s.chunks, stream: true });
  await prime(target, s.primeS);
  // Warm: a few streams first, so that RSS "before" has the code paths loaded.
  const warm = await startStreamClient();
  const protocol = s.protocol ?? "rest";
  await warm.run(
    { url: target.url, count: 20, body, chunks: s.chunks, rampMs: 0, protocol },
    () => undefined,
  );
  warm.close();
  await new Promise((r) => setTimeout(r, 1000));
  const rssBeforeBytes = treeRss(target.pid);

  const nClients = Math.max(1, Math.ceil(s.streams / s.perClient));
  const clients: StreamClient[] = await Promise.all(
    Array.from({ length: nClients }, () => startStreamClient()),
  );
  const open = new Array<number>(nClients).fill(0);
  const ended = new Array<number>(nClients).fill(0);
  const openNow = () => open.reduce((a, b) => a + b, 0);
  let peakOpen = 0;
  let rssPeakBytes = rssBeforeBytes;
  let processes = 1;
  let running = true;
  const sampler = (async () => {
    while (running) {
      const tree = processTree(target.pid);
      processes = Math.max(processes, tree.length);
      rssPeakBytes = Math.max(
        rssPeakBytes,
        tree.reduce((a, p) => a + rssBytes(p), 0),
      );
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  /** Probes `url`'s /healthz every 100 ms on a new connection while the run lasts. */
  const probe = (url: string) => {
    const probes: HealthProbes = { all: [], ramp: [], allOpen: [], failed: 0 };
    const done = (async () => {
      if (!health) return;
      while (running) {
        // Tagged by what was true when the probe started: still ramping (not every stream opened
        // yet, open or ended), or every stream open.
        const opened = openNow() + ended.reduce((a, b) => a + b, 0);
        const phase = opened < s.streams ? probes.ramp : openNow() === s.streams ? probes.allOpen : undefined;
        const ms = await healthz(url);
        if (Number.isNaN(ms)) probes.failed++;
        else {
          probes.all.push(ms);
          phase?.push(ms);
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    return { probes, done };
  };
  const main = probe(target.url);
  const ops = opsUrl === undefined ? undefined : probe(opsUrl);
  const t0 = performance.now();
  const cpu0 = treeCpuSeconds(target.pid);
  const reports: StreamReport[] = await Promise.all(
    clients.map((c, i) =>
      c.run(
        {
          url: target.url,
          count: Math.floor(s.streams / nClients) + (i < s.streams % nClients ? 1 : 0),
          protocol,
          body,
          chunks: s.chunks,
          rampMs: s.rampMs,
        },
        (p) => {
          open[i] = p.open;
          ended[i] = p.done + p.failed;
          peakOpen = Math.max(peakOpen, openNow());
        },
      ),
    ),
  );
  const seconds = (performance.now() - t0) / 1000;
  const cpuSeconds = treeCpuSeconds(target.pid) - cpu0;
  running = false;
  await Promise.all([sampler, main.done, ops?.done]);
  for (const c of clients) c.close();
  const failures: Record<string, number> = {};
  for (const r of reports)
    for (const [k, n] of Object.entries(r.failures)) failures[k] = (failures[k] ?? 0) + n;
  return {
    streams: s.streams,
    ok: reports.reduce((a, r) => a + r.ok, 0),
    failures,
    peakOpen,
    rssBeforeBytes,
    rssPeakBytes,
    processes,
    gaps: merge(reports.map((r) => r.gaps)),
    firstChunk: merge(reports.map((r) => r.firstChunk)),
    healthMs: main.probes.all,
    healthFailed: main.probes.failed,
    healthAllOpenMs: main.probes.allOpen,
    healthRampMs: main.probes.ramp,
    ops: ops?.probes,
    seconds,
    cpuSeconds,
  };
}

const MiB = 2 ** 20;
const fmt = (x: number, digits = 0) =>
  Number.isNaN(x)
    ? "—"
    : x.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
const failuresText = (f: Record<string, number>) => {
  const parts = Object.entries(f).map(([k, n]) => `${n} × ${k}`);
  return parts.length === 0 ? "0" : parts.join(", ");
};
/** CPU per stream, ms: all of a stream (its request, its chunks and `[DONE]`) over the run. */
const cpuPerStreamMs = (r: RunResult) => (r.ok === 0 ? Number.NaN : (r.cpuSeconds * 1000) / r.ok);
const sortedQuantile = (xs: number[], q: number) => {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)] as number;
};
/** `/healthz` latencies as "p50 / p99 / max ms (n probes)". */
const healthText = (h: number[]) =>
  `${fmt(sortedQuantile(h, 0.5), 1)} / ${fmt(sortedQuantile(h, 0.99), 1)} / ${fmt(h.length === 0 ? Number.NaN : Math.max(...h), 1)} ms (${h.length} probes)`;

/** Waits until the gateway's primary reports `workers` workers listening (/metrics). */
async function workersListening(url: string, workers: number): Promise<void> {
  if (workers <= 1) return;
  for (;;) {
    try {
      const text = await (await fetch(`${url}/metrics`)).text();
      if (new RegExp(`^acs_cluster_workers ${workers}$`, "m").test(text)) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 200));
  }
}

export async function benchStreams(): Promise<string> {
  const streams = envInt("BENCH_STREAMS", 10_000);
  const one = envInt("BENCH_STREAMS_ONE", 5000);
  const chunks = Math.max(1, envInt("BENCH_STREAMS_CHUNKS", 30));
  const chunkMs = envInt("BENCH_STREAMS_CHUNK_MS", 1000);
  const perClient = Math.max(1, envInt("BENCH_STREAMS_PER_CLIENT", 2500));
  const primeS = envInt("BENCH_STREAMS_PRIME_S", 10);
  const rampFor = (n: number) => envInt("BENCH_STREAMS_RAMP_S", Math.max(3, Math.round(n / 1000))) * 1000;
  const workers = Math.max(1, envInt("ACS_WORKERS", availableParallelism()));
  const gateway = gatewayCommand(process.env.BENCH_GATEWAY_CMD);
  const load = { before: loadavg()[0] as number, after: Number.NaN };
  const started = new Date().toISOString();
  const dir = mkdtempSync(join(tmpdir(), "acs-bench-streams-"));
  const servers: ServerProcess[] = [];
  const start = async (p: Promise<ServerProcess>) => {
    const s = await p;
    servers.push(s);
    return s;
  };
  const stop = async (s: ServerProcess) => {
    await s.stop();
    servers.splice(servers.indexOf(s), 1);
  };
  /** A gateway with an ops port (ACS_OPS_PORT), probed beside its main port; `opsUrl` is that port's. */
  const startGateway = async (name: string, env: Record<string, string>) => {
    const [port, opsPort] = [await freePort(), await freePort()];
    const url = `http://127.0.0.1:${port}`;
    const s = await start(
      spawnServer(name, gateway.argv, {
        cwd: ROOT,
        env: { PORT: String(port), ACS_OPS_PORT: String(opsPort), ACS_LOG_LEVEL: "warn", ...env },
        url,
        readyPath: "/readyz",
        timeoutMs: 180_000,
      }),
    );
    await workersListening(url, Number(env.ACS_WORKERS ?? "1"));
    return { server: s, opsUrl: `http://127.0.0.1:${opsPort}` };
  };
  try {
    const fake = await start(
      spawnServer("fake-vllm", [
        ...TSX,
        join(ROOT, "bench/hotpath/fake-vllm.ts"),
        "--chunks",
        String(chunks),
        "--chunk-delay-ms",
        String(chunkMs),
        "--exit-with-stdin",
      ]),
    );
    const models = join(dir, "models.json");
    writeFileSync(
      models,
      JSON.stringify({
        models: [{ id: MODEL, upstream_url: fake.url, hidden_size: 4096, num_hidden_layers: 32 }],
      }),
    );
    const lines: string[] = [];

    // 1. N streams through ACS_WORKERS processes.
    console.error(`  streams: ${fmt(streams)} streams through the gateway with ACS_WORKERS=${workers}`);
    const many = await startGateway("acs-gateway (workers)", {
      ACS_MODELS: models,
      ACS_WORKERS: String(workers),
    });
    const r1 = await runStreams(
      many.server,
      { streams, primeS, chunks, rampMs: rampFor(streams), perClient },
      true,
      many.opsUrl,
    );
    await stop(many.server);
    console.error(
      `  streams: ${fmt(r1.ok)} of ${fmt(streams)} complete; failures ${failuresText(r1.failures)}`,
    );

    // 2. M streams through one process, and through the bare proxy.
    const rows: Array<[string, RunResult]> = [];
    if (one > 0) {
      for (const [name, launch, protocol] of [
        [
          "acs-gateway, one process",
          () => startGateway("acs-gateway (one)", { ACS_MODELS: models, ACS_WORKERS: "1" }),
          "rest",
        ],
        [
          "acs-gateway, one process, Connect streams (HTTP/1.1)",
          () => startGateway("acs-gateway (one, Connect)", { ACS_MODELS: models, ACS_WORKERS: "1" }),
          "connect",
        ],
        [
          "bare proxy",
          () =>
            start(
              spawnServer("bare-proxy", [
                ...TSX,
                join(ROOT, "bench/hotpath/bare-proxy.ts"),
                "--upstream",
                fake.url,
                "--connections",
                "16384",
                "--exit-with-stdin",
              ]),
            ),
          "rest",
        ],
      ] as const) {
        console.error(`  streams: ${fmt(one)} streams through the ${name}`);
        const launched = await launch();
        const [target, opsUrl] =
          "server" in launched ? [launched.server, launched.opsUrl] : [launched, undefined];
        const r = await runStreams(
          target,
          { streams: one, protocol, primeS, chunks, rampMs: rampFor(one), perClient },
          true,
          opsUrl,
        );
        await stop(target);
        rows.push([name, r]);
        console.error(
          `  streams: ${fmt(r.ok)} of ${fmt(one)} complete; failures ${failuresText(r.failures)}`,
        );
      }
    }
    load.after = loadavg()[0] as number;

    const h = r1.healthMs;
    lines.push(
      "## Streams",
      "",
      `Run ${started}; ${cpus().length} cores shared with other work, load average (1 min) ${load.before.toFixed(1)} before, ${load.after.toFixed(1)} after: every figure includes that contention. The bench's fake vLLM sends ${chunks} chunks per stream, one every ${fmt(chunkMs)} ms (each its own write, then \`data: [DONE]\` and the chunked terminator in two writes); every stream is \`{"model", "prompt": "The sky is", "max_tokens": ${chunks}, "stream": true}\` on a connection of its own, from ⌈streams / ${fmt(perClient)}⌉ client processes, opened evenly over the ramp; every target was first primed with ${fmt(primeS)} s of one-token streams (64 keep-alive connections, unmeasured), as the hotpath section primes its own; a stream counts as complete only with all ${chunks} chunks and \`[DONE]\`. Gateway: \`${gateway.label}\`, keys off, ACS_MODELS naming the fake (max_concurrent_requests: its default, 16,384).`,
      "",
      `### ${fmt(streams)} streams through ACS_WORKERS=${workers}`,
      "",
      "| streams | complete | failures | most open at once | RSS, all gateway processes (before → peak) | `/healthz` p50 / p99 / max during the run (new connection each) | chunk gap p50 / p99 | first chunk p50 / p99 | CPU per stream, all gateway processes |",
      "|---|---|---|---|---|---|---|---|---|",
      `| ${fmt(streams)} | ${fmt(r1.ok)} | ${failuresText(r1.failures)} | ${fmt(r1.peakOpen)} | ${r1.processes} processes: ${fmt(r1.rssBeforeBytes / MiB)} → ${fmt(r1.rssPeakBytes / MiB)} MiB | ${healthText(h)}${r1.healthFailed > 0 ? `, ${r1.healthFailed} failed` : ""} | ${fmt(quantile(r1.gaps, 0.5))} / ${fmt(quantile(r1.gaps, 0.99))} ms | ${fmt(quantile(r1.firstChunk, 0.5))} / ${fmt(quantile(r1.firstChunk, 0.99))} ms | ${fmt(cpuPerStreamMs(r1), 2)} ms |`,
      "",
      "| `/healthz` by phase (a probe is tagged by the clients' last progress report, sent every 250 ms, when it started) | p50 / p99 / max |",
      "|---|---|",
      `| the ramp: ${fmt(streams)} streams opened over ${fmt(rampFor(streams) / 1000)} s (${fmt(streams / (rampFor(streams) / 1000))} new a second) | ${healthText(r1.healthRampMs)} |`,
      `| all ${fmt(streams)} streams open at once (every request sent, none ended; connections still queued from the ramp count as open) | ${healthText(r1.healthAllOpenMs)} |`,
      ...(r1.ops === undefined
        ? []
        : [
            `| the ops port (ACS_OPS_PORT, answered by the primary), the ramp | ${healthText(r1.ops.ramp)} |`,
            `| the ops port, all open at once | ${healthText(r1.ops.allOpen)} |`,
            `| the ops port, the whole run | ${healthText(r1.ops.all)}${r1.ops.failed > 0 ? `, ${r1.ops.failed} failed` : ""} |`,
          ]),
      "",
    );
    if (rows.length > 0) {
      lines.push(
        `### ${fmt(one)} streams in one process`,
        "",
        "| target | complete | failures | RSS before → peak | memory per stream | chunk gap p50 / p99 | first chunk p50 / p99 | CPU per stream | `/healthz` p50 / p99 / max: the ramp | all open at once |",
        "|---|---|---|---|---|---|---|---|---|---|",
        ...rows.map(
          ([name, r]) =>
            `| ${name} | ${fmt(r.ok)} | ${failuresText(r.failures)} | ${fmt(r.rssBeforeBytes / MiB)} → ${fmt(r.rssPeakBytes / MiB)} MiB | ${fmt((r.rssPeakBytes - r.rssBeforeBytes) / 1024 / r.streams, 1)} KiB | ${fmt(quantile(r.gaps, 0.5))} / ${fmt(quantile(r.gaps, 0.99))} ms | ${fmt(quantile(r.firstChunk, 0.5))} / ${fmt(quantile(r.firstChunk, 0.99))} ms | ${fmt(cpuPerStreamMs(r), 2)} ms | ${healthText(r.healthRampMs)} | ${healthText(r.healthAllOpenMs)} |`,
        ),
        "",
        ...rows.flatMap(([name, r]) =>
          r.ops === undefined
            ? []
            : [
                `\`/healthz\` on the ops port (ACS_OPS_PORT) of the ${name}: the ramp ${healthText(r.ops.ramp)}; all open at once ${healthText(r.ops.allOpen)}${r.ops.failed > 0 ? `; ${r.ops.failed} failed` : ""}.`,
                "",
              ],
        ),
        `Memory per stream = (peak RSS during the run − RSS after 20 warm-up streams) ÷ ${fmt(one)}. A chunk gap is the time between two consecutive chunks of one stream as its client read them; the fake spaces them ${fmt(chunkMs)} ms apart. CPU per stream = CPU time (user + system, /proc) of the target's processes from the first stream opened to the last one ended ÷ streams complete: a stream's request, its ${chunks} chunks (each alone in its read and its write) and \`[DONE]\`; the system time includes the loopback's delivery to the client.`,
      );
    }
    return lines.join("\n");
  } finally {
    for (const s of [...servers].reverse()) await s.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
