/**
 * `npm run bench -- hotpath`: the gateway's own cost next to a bare proxy's, in one run.
 *
 * Processes, all on 127.0.0.1: a fast fake vLLM (./fake-vllm.ts), a bare undici pass-through proxy
 * (./bare-proxy.ts), the gateway twice as production runs it (src/main.ts with ACS_MODELS naming the
 * fake; once with ACS_DB: keys and Budgets on), and autocannon in a forked load worker
 * (./load-worker.ts). Each cell warms up, then measures a window; the targets are interleaved
 * (round-robin, the order rotated every round) and every figure is the median over the rounds,
 * ratios and differences taken within a round.
 *
 * Measured: p50/p99 latency, added p50 over calling the fake directly (1 connection; keys on also
 * over the fake's own stream, which is what a keys-on non-stream request asks it for), req/s and the
 * ratio to the bare proxy, chunks/s for streams; CPU per streamed chunk (process CPU from /proc over
 * the window, divided by the chunks relayed); with a second fake that adds a 2 ms hop to every
 * answer, the added p50 of a new short text prompt and of a token-id prompt, sent in turn on one
 * connection and timed apart (a text prompt would cost one /tokenize more if its bound did not decide);
 * the CPU a non-stream request costs by layer (64 connections): node:http and fastify answering a
 * fixed completion (./floor-server.ts), the fake, the bare proxy, the gateway's `GET /healthz` (its
 * HTTP stack: fastify with the gateway's hooks) and its completions, keys off and on;
 * and a CPU profile of the gateway under 64-connection non-stream load, summarised by module.
 *
 * Every target is first primed (--prime S, default 10: half non-stream, half stream, 64
 * connections) so that the figures are those of a process in its steady state — V8 keeps
 * optimizing a large code base for many seconds of load, and the gateway's CPU per request after
 * 0.5 s of load is ~30% above what it is after 20 s; a production process runs for hours.
 *
 * Options (after `npm run bench -- hotpath`): --quick (1 round of 1 s cells, 2 s profiles, 2 s
 * priming), --duration S (window per cell, default 3), --warmup S (0.5), --prime S (10), --rounds N (3), --connections
 * 1,64,256, --chunks N (tokens per completion = chunks per stream, 16), --hop-ms MS (2), --profile-s
 * S (5), --skip-profile, --skip-layers, --gateway-cmd "node dist/main.js" (or env BENCH_GATEWAY_CMD; otherwise
 * dist/main.js or dist/src/main.js when built after the last change to src/, else
 * `node --import tsx src/main.ts`). The command must exec node itself (its pid is the one measured).
 *
 * The pieces (spawnServer, startLoadWorker, the fake, the proxy) are meant for the later `streams`
 * section (10,000 concurrent streams) as well.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { createBudgetLedger } from "../../src/budget/index.js";
import { freePort } from "../../test/helpers/processes.js";
import { type CpuProfile, summariseProfile, summaryMarkdown } from "../profile-summary.js";
import { fakeCompletionText } from "./fake-vllm.js";
import {
  type LoadBody,
  type LoadResult,
  type LoadWorker,
  type PromptKind,
  startLoadWorker,
} from "./load-worker.js";
import { type ServerProcess, spawnServer } from "./processes.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const MODEL = "bench-model";
const TSX = [process.execPath, "--import", "tsx"];

/** Options as bench/run.ts parsed them (strings and booleans). */
export type SectionOptions = Record<string, string | boolean | undefined>;

interface Config {
  measureS: number;
  warmupS: number;
  /** Seconds of load on each target before the first round (half non-stream, half stream). */
  primeS: number;
  rounds: number;
  connections: number[];
  chunks: number;
  hopMs: number;
  profileS: number;
  profile: boolean;
  /** Run the cost-by-layer cells (floor servers, `GET /healthz`). */
  layers: boolean;
  gateway: { argv: string[]; label: string };
}

function num(o: SectionOptions, key: string, fallback: number): number {
  const v = o[key];
  if (v === undefined || typeof v === "boolean") return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--${key} must be a non-negative number, got ${v}`);
  return n;
}

/** Newest modification time of the files under `dir` whose name ends with `suffix`, ms. */
function newestMtime(dir: string, suffix = ""): number {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) newest = Math.max(newest, newestMtime(p, suffix));
    else if (e.name.endsWith(suffix)) newest = Math.max(newest, statSync(p).mtimeMs);
  }
  return newest;
}

/**
 * The gateway's command: an explicit one (`--gateway-cmd`, BENCH_GATEWAY_CMD; a leading `node` is
 * this Node), else a compiled entry built after the last change under src/, else tsx on src/main.ts.
 */
export function gatewayCommand(override: string | undefined): { argv: string[]; label: string } {
  if (override !== undefined && override.trim() !== "") {
    const argv = override.trim().split(/\s+/);
    if (argv[0] === "node") argv[0] = process.execPath;
    return { argv, label: override.trim() };
  }
  // tsc rewrites only the outputs that changed: the build is current when its newest file is newer
  // than the newest TypeScript source (a README or an unchanged main.js says nothing).
  const srcMtime = newestMtime(join(ROOT, "src"), ".ts");
  const stale: string[] = [];
  for (const rel of ["dist/main.js", "dist/src/main.js"]) {
    const p = join(ROOT, rel);
    if (!existsSync(p)) continue;
    if (newestMtime(join(ROOT, "dist"), ".js") >= srcMtime)
      return { argv: [process.execPath, p], label: `node ${rel}` };
    stale.push(rel);
  }
  const note = stale.length > 0 ? ` (${stale.join(", ")} older than src/: not used)` : "";
  return { argv: [...TSX, join(ROOT, "src/main.ts")], label: `node --import tsx src/main.ts${note}` };
}

function configFrom(o: SectionOptions): Config {
  const quick = o.quick === true;
  const connections = String(o.connections ?? "1,64,256")
    .split(",")
    .map((c) => Number(c.trim()));
  if (!connections.every((c) => Number.isInteger(c) && c >= 1)) {
    throw new Error(`--connections must be a list of positive integers, got ${o.connections}`);
  }
  const cmd = typeof o["gateway-cmd"] === "string" ? o["gateway-cmd"] : process.env.BENCH_GATEWAY_CMD;
  return {
    measureS: num(o, "duration", quick ? 1 : 3),
    warmupS: num(o, "warmup", quick ? 0.3 : 0.5),
    primeS: num(o, "prime", quick ? 2 : 10),
    rounds: Math.max(1, Math.round(num(o, "rounds", quick ? 1 : 3))),
    connections,
    chunks: Math.max(1, Math.round(num(o, "chunks", 16))),
    hopMs: num(o, "hop-ms", 2),
    profileS: num(o, "profile-s", quick ? 2 : 5),
    profile: o["skip-profile"] !== true,
    layers: o["skip-layers"] !== true,
    gateway: gatewayCommand(cmd),
  };
}

interface Target {
  key: "fake" | "bare" | "off" | "on";
  name: string;
  server: ServerProcess;
  headers: Record<string, string>;
}

/** A target of {@link runRounds}: a server, and the route and method its cells call. */
interface RoundTarget {
  key: string;
  name: string;
  server: ServerProcess;
  headers: Record<string, string>;
  /** @default "/v1/completions" */
  path?: string;
  /** @default "POST" */
  method?: "GET" | "POST";
}

/** The route and method a target's cells call, as load-worker job fields (none: its defaults). */
function routeOf(t: RoundTarget): { path?: string; method?: "GET" | "POST" } {
  return {
    ...(t.path === undefined ? {} : { path: t.path }),
    ...(t.method === undefined ? {} : { method: t.method }),
  };
}

const median = (xs: number[]): number => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};
const fmtMs = (x: number) => (Number.isNaN(x) ? "—" : Math.abs(x) < 10 ? x.toFixed(2) : x.toFixed(1));
const signed = (x: number, unit = "") =>
  Number.isNaN(x) ? "—" : `${x >= 0 ? "+" : "−"}${fmtMs(Math.abs(x))}${unit}`;
const fmtInt = (x: number) => (Number.isNaN(x) ? "—" : Math.round(x).toLocaleString("en-US"));
const ratio = (x: number) => (Number.isNaN(x) ? "—" : x.toFixed(2));

/** Starts the gateway on a free port; `nodeFlags` go right after the node executable. */
async function startGateway(
  cfg: Config,
  name: string,
  env: Record<string, string>,
  nodeFlags: string[] = [],
): Promise<ServerProcess> {
  const port = await freePort();
  const [exe, ...rest] = cfg.gateway.argv as [string, ...string[]];
  if (nodeFlags.length > 0 && exe !== process.execPath && !/(^|\/)node[\d.]*$/.test(exe)) {
    throw new Error(`cannot add ${nodeFlags.join(" ")} to ${cfg.gateway.label}: it does not start with node`);
  }
  return spawnServer(name, [exe, ...nodeFlags, ...rest], {
    cwd: ROOT,
    // One process: the CPU per chunk is read from this pid (the streams section runs ACS_WORKERS).
    env: { PORT: String(port), ACS_WORKERS: "1", ...env },
    url: `http://127.0.0.1:${port}`,
    readyPath: "/readyz",
  });
}

/** One non-stream and one stream request per target: the answers the load will get, checked. */
async function checkTargets(targets: Target[], chunks: number): Promise<void> {
  const body = { model: MODEL, prompt: "The sky is", max_tokens: chunks, temperature: 0 };
  const expected = fakeCompletionText(chunks);
  for (const t of targets) {
    const post = (b: object) =>
      fetch(`${t.server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...t.headers },
        body: JSON.stringify(b),
      });
    let r1 = await post(body);
    let text1 = await r1.text();
    if (r1.status === 503) {
      // Seen on a gateway's first request now and then under heavy machine load (UND_ERR_SOCKET
      // from the fake): said, then asked once more, so that one such answer does not lose the run.
      console.error(`  hotpath: ${t.name}: first request answered 503, once more: ${text1.slice(0, 300)}`);
      r1 = await post(body);
      text1 = await r1.text();
    }
    const choice = r1.ok
      ? (JSON.parse(text1) as { choices?: Array<{ text?: string }> }).choices?.[0]
      : undefined;
    if (choice?.text !== expected) {
      throw new Error(
        `${t.name}: non-stream answer ${r1.status} ${text1.slice(0, 500)} (expected text ${JSON.stringify(expected)})`,
      );
    }
    const r2 = await post({ ...body, stream: true });
    const text2 = await r2.text();
    const events = text2.split("\n\n").filter((e) => e.startsWith("data: "));
    const withChoice = events.filter((e) => e.startsWith("data: {") && !e.includes('"choices":[]'));
    if (!r2.ok || withChoice.length !== chunks || events.at(-1) !== "data: [DONE]") {
      throw new Error(
        `${t.name}: stream answer ${r2.status} with ${withChoice.length} chunks (expected ${chunks}): ${text2.slice(0, 500)}`,
      );
    }
  }
}

type Mode = "non-stream" | "stream";

/** One kind of cell, run against every target. */
interface PlanItem {
  /** Results are keyed `${key}|${target key}`. */
  key: string;
  label: string;
  connections: number;
  body: LoadBody;
}

/**
 * Runs every plan item against every target for `cfg.rounds` rounds, targets interleaved within a
 * round and their order rotated each round. Results: one per round, keyed `${item.key}|${target.key}`.
 */
async function runRounds(
  worker: LoadWorker,
  cfg: Config,
  targets: RoundTarget[],
  plan: PlanItem[],
  cpuPids: number[],
  label: string,
): Promise<Map<string, LoadResult[]>> {
  const out = new Map<string, LoadResult[]>();
  const total = cfg.rounds * plan.length * targets.length;
  let done = 0;
  for (let round = 0; round < cfg.rounds; round++) {
    const order = targets.map((_, i) => targets[(i + round) % targets.length] as RoundTarget);
    for (const p of plan) {
      for (const t of order) {
        // A pause, so that the previous cell's aborted requests are cleaned up before this one.
        await new Promise((r) => setTimeout(r, 250));
        const result = await worker.run({
          url: t.server.url,
          ...routeOf(t),
          headers: t.headers,
          body: p.body,
          connections: p.connections,
          warmupS: cfg.warmupS,
          measureS: cfg.measureS,
          cpuPids,
        });
        for (const s of targets) {
          if (s.server.child.exitCode !== null || s.server.child.signalCode !== null) {
            throw new Error(
              `${s.name} exited (${s.server.child.exitCode ?? s.server.child.signalCode}) during the run:\n${s.server.output()}`,
            );
          }
        }
        const key = `${p.key}|${t.key}`;
        out.set(key, [...(out.get(key) ?? []), result]);
        done++;
        console.error(
          `  ${label} round ${round + 1}/${cfg.rounds} ${p.label} ${t.name}: p50 ${fmtMs(result.p50Ms)} ms, ${fmtInt(result.rps)} req/s (${done}/${total})`,
        );
      }
    }
  }
  return out;
}

/**
 * Loads every target for `cfg.primeS` seconds (half with `bodies[0]`, half with `bodies[1]`, 64
 * connections), unmeasured: the processes reach their steady state (V8's optimizing compiler done
 * with the hot code) before anything is measured.
 */
async function prime(
  worker: LoadWorker,
  cfg: Config,
  targets: RoundTarget[],
  bodies: LoadBody[],
): Promise<void> {
  if (cfg.primeS <= 0) return;
  for (const t of targets) {
    for (const body of bodies) {
      await worker.run({
        url: t.server.url,
        ...routeOf(t),
        headers: t.headers,
        body,
        connections: 64,
        warmupS: 0,
        measureS: cfg.primeS / bodies.length,
        cpuPids: [],
      });
    }
    console.error(`  hotpath: primed ${t.name} (${cfg.primeS} s of load)`);
  }
}

/** Per-round values of f(target result, same-round result of `other`), their median. */
function paired(
  a: LoadResult[] | undefined,
  b: LoadResult[] | undefined,
  f: (x: LoadResult, y: LoadResult) => number,
) {
  if (a === undefined || b === undefined) return Number.NaN;
  return median(a.map((x, i) => (b[i] === undefined ? Number.NaN : f(x, b[i] as LoadResult))));
}

export async function benchHotpath(options: SectionOptions = {}): Promise<string> {
  const cfg = configFrom(options);
  const loadBefore = loadavg()[0] as number;
  const dir = mkdtempSync(join(tmpdir(), "acs-hotpath-"));
  const servers: ServerProcess[] = [];
  let worker: LoadWorker | undefined;
  try {
    const start = async (p: Promise<ServerProcess>) => {
      const s = await p;
      servers.push(s);
      return s;
    };
    const fakeArgs = (hop: number) => [
      ...TSX,
      join(ROOT, "bench/hotpath/fake-vllm.ts"),
      "--model",
      MODEL,
      "--chunks",
      String(cfg.chunks),
      "--hop-ms",
      String(hop),
      "--exit-with-stdin",
    ];
    const proxyArgs = (upstream: string) => [
      ...TSX,
      join(ROOT, "bench/hotpath/bare-proxy.ts"),
      "--upstream",
      upstream,
      "--exit-with-stdin",
    ];
    const modelsFile = (name: string, upstream: string) => {
      const path = join(dir, name);
      writeFileSync(
        path,
        JSON.stringify({
          models: [
            {
              id: MODEL,
              upstream_url: upstream,
              hidden_size: 4096,
              num_hidden_layers: 32,
              // The fake's tokenizer (a token per word + BOS) is within the byte-level bound.
              byte_level_tokenizer: true,
            },
          ],
        }),
      );
      return path;
    };
    const dbPath = join(dir, "keys.db");
    const ledger = await createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 });
    const { key } = await ledger.createKey({ name: "bench", budgetTokens: 1_000_000_000_000 });
    await ledger.close();

    console.error(`  hotpath: starting the fake, the bare proxy and two gateways (${cfg.gateway.label})`);
    const fake = await start(spawnServer("fake-vllm", fakeArgs(0)));
    const bare = await start(spawnServer("bare-proxy", proxyArgs(fake.url)));
    const models = modelsFile("models.json", fake.url);
    const off = await start(startGateway(cfg, "acs-gateway", { ACS_MODELS: models }));
    const on = await start(
      startGateway(cfg, "acs-gateway (keys on)", { ACS_MODELS: models, ACS_DB: dbPath }),
    );
    worker = await startLoadWorker();

    const targets: Target[] = [
      { key: "fake", name: "fake vLLM (direct)", server: fake, headers: {} },
      { key: "bare", name: "bare proxy", server: bare, headers: {} },
      { key: "off", name: "acs-gateway", server: off, headers: {} },
      { key: "on", name: "acs-gateway, keys on", server: on, headers: { authorization: `Bearer ${key}` } },
    ];
    await checkTargets(targets, cfg.chunks);
    const base = { model: MODEL, prompt: "The sky is", max_tokens: cfg.chunks, temperature: 0 };
    const plan = (["non-stream", "stream"] as const).flatMap((mode) =>
      cfg.connections.map((connections) => ({
        key: `${mode}|${connections}`,
        label: `${mode} c=${connections}`,
        connections,
        body: JSON.stringify(mode === "stream" ? { ...base, stream: true } : base),
      })),
    );
    await prime(worker, cfg, targets, [JSON.stringify(base), JSON.stringify({ ...base, stream: true })]);
    const main = await runRounds(
      worker,
      cfg,
      targets,
      plan,
      servers.map((s) => s.pid),
      "main",
    );

    const layers = cfg.layers
      ? await runLayers(worker, cfg, targets, JSON.stringify(base), start)
      : undefined;

    // The 2 ms hop: a second fake, proxy and gateway; a new prompt every request, 1 connection.
    console.error(`  hotpath: ${cfg.hopMs} ms hop`);
    const fakeHop = await start(spawnServer("fake-vllm (hop)", fakeArgs(cfg.hopMs)));
    const bareHop = await start(spawnServer("bare-proxy (hop)", proxyArgs(fakeHop.url)));
    const offHop = await start(
      startGateway(cfg, "acs-gateway (hop)", { ACS_MODELS: modelsFile("models-hop.json", fakeHop.url) }),
    );
    const hopTargets: Target[] = [
      { key: "fake", name: "fake vLLM (direct)", server: fakeHop, headers: {} },
      { key: "bare", name: "bare proxy", server: bareHop, headers: {} },
      { key: "off", name: "acs-gateway", server: offHop, headers: {} },
    ];
    await checkTargets(hopTargets, cfg.chunks);
    await prime(worker, cfg, hopTargets, [JSON.stringify(base)]);
    const hopBase = { model: MODEL, max_tokens: cfg.chunks, temperature: 0 };
    // Text and token-id prompts in turn on the one connection, each kind timed apart: the two are
    // compared within one window (two cells seconds apart differed by ±0.3 ms on this VM).
    const hop = await runRounds(
      worker,
      cfg,
      hopTargets,
      [
        {
          key: "alternate",
          label: "new text and token-id prompts in turn c=1",
          connections: 1,
          body: { fresh: "alternate", base: hopBase },
        },
      ],
      [fakeHop.pid, bareHop.pid, offHop.pid],
      "hop",
    );
    for (const s of [fakeHop, bareHop, offHop]) await s.stop();

    const profiles: string[] = [];
    if (cfg.profile) {
      const keysOn = { ACS_MODELS: models, ACS_DB: dbPath };
      const auth = { authorization: `Bearer ${key}` };
      for (const [label, env, headers, body] of [
        ["acs-gateway", { ACS_MODELS: models }, {}, base],
        ["acs-gateway", { ACS_MODELS: models }, {}, { ...base, stream: true }],
        ["acs-gateway, keys on", keysOn, auth, base],
      ] as const) {
        profiles.push(await profileGateway(worker, cfg, dir, label, env, headers, body));
      }
    }
    const pids = { fake: fake.pid, bare: bare.pid, off: off.pid, on: on.pid };
    const load = { before: loadBefore, after: loadavg()[0] as number };
    return render(cfg, main, hop, pids, profiles, load, layers);
  } finally {
    worker?.close();
    await Promise.all(servers.map((s) => s.stop()));
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A gateway with --cpu-prof under 64-connection non-stream load; the summary of the load window. */
async function profileGateway(
  worker: LoadWorker,
  cfg: Config,
  dir: string,
  label: string,
  env: Record<string, string>,
  headers: Record<string, string>,
  body: object,
): Promise<string> {
  console.error(`  hotpath: profiling ${label}`);
  const profDir = mkdtempSync(join(dir, "prof-"));
  const gw = await startGateway(cfg, `${label} (--cpu-prof)`, env, [
    "--cpu-prof",
    `--cpu-prof-dir=${profDir}`,
  ]);
  let result: LoadResult;
  try {
    result = await worker.run({
      url: gw.url,
      headers,
      body: JSON.stringify(body),
      connections: 64,
      // As primed as the measured gateways: the profile is of the steady state.
      warmupS: Math.max(1, cfg.primeS),
      measureS: cfg.profileS,
      cpuPids: [gw.pid],
    });
  } finally {
    await gw.stop(); // SIGTERM: the gateway exits itself, and Node writes the profile
  }
  const files = readdirSync(profDir).filter((f) => f.endsWith(".cpuprofile"));
  const largest = files
    .map((f) => ({ f, size: statSync(join(profDir, f)).size }))
    .sort((a, b) => b.size - a.size)[0];
  if (largest === undefined)
    return `### Profile: ${label}\n\nNo .cpuprofile was written (did the gateway exit cleanly?).`;
  const profile = JSON.parse(readFileSync(join(profDir, largest.f), "utf8")) as CpuProfile;
  const summary = summariseProfile(profile, {
    root: ROOT,
    fromUs: result.windowStartUs,
    toUs: result.windowEndUs,
    top: 12,
    lineNumbers: !cfg.gateway.label.includes("tsx"),
  });
  return [
    `### Profile: ${label}, 64 connections, ${"stream" in body && body.stream === true ? "stream" : "non-stream"}`,
    "",
    `${fmtInt(result.rps)} req/s in the window; the gateway used ${(result.cpuS[gw.pid] ?? 0).toFixed(2)} CPU s in ${result.windowS.toFixed(1)} s. Self time of the samples in the load window only (start-up and shutdown left out); samples are wall-clock, so a blocking fsync, or the gateway waiting for a CPU, counts where it stands. \`npx tsx bench/profile-summary.ts FILE.cpuprofile\` prints the same for any profile.${cfg.gateway.label.includes("tsx") ? " Functions are named without line numbers: tsx's output is mostly one line." : ""}`,
    "",
    summaryMarkdown(summary, 14),
  ].join("\n");
}

/** The connections of the cost-by-layer cells. */
const LAYER_CONNECTIONS = 64;

/**
 * The cost-by-layer cells: the two floor servers (node:http and fastify answering a fixed
 * completion), the fake, the bare proxy, the gateway's `GET /healthz` and its completions (keys
 * off and on), non-stream, {@link LAYER_CONNECTIONS} connections, interleaved rounds as the main
 * cells. Returns the markdown of the table and of what follows from it.
 */
async function runLayers(
  worker: LoadWorker,
  cfg: Config,
  targets: Target[],
  body: string,
  start: (p: Promise<ServerProcess>) => Promise<ServerProcess>,
): Promise<string> {
  console.error("  hotpath: cost by layer");
  const floor = (framework: "http" | "fastify") =>
    start(
      spawnServer(`floor-${framework}`, [
        ...TSX,
        join(ROOT, "bench/hotpath/floor-server.ts"),
        "--framework",
        framework,
        "--chunks",
        String(cfg.chunks),
        "--exit-with-stdin",
      ]),
    );
  const floorHttp = await floor("http");
  const floorFastify = await floor("fastify");
  const by = (key: Target["key"]) => targets.find((t) => t.key === key) as Target;
  const rows: Array<RoundTarget & { what: string }> = [
    { key: "http", name: "floor-http", server: floorHttp, headers: {}, what: "node:http, a fixed answer" },
    {
      key: "fastify",
      name: "floor-fastify",
      server: floorFastify,
      headers: {},
      what: "fastify, one route, a fixed answer",
    },
    { ...by("fake"), what: "the fake vLLM (node:http; checks the request, builds its answer)" },
    { ...by("bare"), what: "the bare proxy (node:http + undici, bytes passed through)" },
    {
      ...by("off"),
      key: "healthz",
      name: "acs-gateway GET /healthz",
      path: "/healthz",
      method: "GET",
      what: "the gateway's HTTP stack: `GET /healthz` (fastify and the gateway's hooks; no access-log line)",
    },
    { ...by("off"), what: "a completion through the gateway" },
    { ...by("on"), what: "a completion through the gateway, keys on" },
  ];
  const plan = [
    { key: "layer", label: `layers c=${LAYER_CONNECTIONS}`, connections: LAYER_CONNECTIONS, body },
  ];
  await prime(worker, cfg, rows.slice(0, 2), [body]);
  const results = await runRounds(
    worker,
    cfg,
    rows,
    plan,
    rows.map((r) => r.server.pid),
    "layers",
  );
  const got = (key: string) => results.get(`layer|${key}`) ?? [];
  const pidOf = (key: string) => (rows.find((r) => r.key === key) as RoundTarget).server.pid;
  // CPU µs per request of `key`'s own process in one round.
  const usOf = (key: string, r: LoadResult) => ((r.cpuS[pidOf(key)] ?? Number.NaN) / r.count) * 1e6;
  const perRequest = (key: string) => median(got(key).map((r) => usOf(key, r)));
  // Per round: a − b, µs per request, then the median.
  const diff = (a: string, b: string) =>
    median(
      got(a).map((r, i) => {
        const o = got(b)[i];
        return o === undefined ? Number.NaN : usOf(a, r) - usOf(b, o);
      }),
    );
  const table = [
    "| layer | CPU µs per request | req/s | × bare proxy | non-2xx / errors |",
    "|---|---:|---:|---:|---:|",
    ...rows.map((r) => {
      const rs = got(r.key);
      const x = paired(rs, got("bare"), (a, b) => a.rps / b.rps);
      return `| ${r.what} | ${fmtMs(perRequest(r.key))} | ${fmtInt(median(rs.map((q) => q.rps)))} | ${ratio(x)} | ${rs.reduce((a, q) => a + q.non2xx, 0)} / ${rs.reduce((a, q) => a + q.errors + q.timeouts, 0)} |`;
    }),
  ];
  const bare = perRequest("bare");
  const us = (x: number) => `${fmtMs(x)} µs`;
  return [
    `### What a non-stream request costs, by layer (${LAYER_CONNECTIONS} connections)`,
    "",
    `CPU of the serving process only (/proc utime + stime over the window ÷ responses in it; median of ${cfg.rounds} interleaved round${cfg.rounds > 1 ? "s" : ""}). Every POST carries the same body as the main cells; the two floor servers (bench/hotpath/floor-server.ts) read it, parse it as JSON and answer a fixed completion of the same text.`,
    "",
    table.join("\n"),
    "",
    `- fastify over node:http: ${signed(diff("fastify", "http"), " µs")} per request.`,
    `- The upstream exchange of a pass-through (bare proxy − node:http floor): ${signed(diff("bare", "http"), " µs")}.`,
    `- The gateway's HTTP stack (\`GET /healthz\`) over the fastify floor: ${signed(diff("healthz", "fastify"), " µs")} (a GET without a body against a POST with one).`,
    `- A completion through the gateway above its HTTP stack (\`POST /v1/completions\` − \`GET /healthz\`): ${signed(diff("off", "healthz"), " µs")}; keys on: ${signed(diff("on", "healthz"), " µs")}.`,
    `- When its one core is what limits a process, its throughput goes as 1 ÷ its CPU per request: 0.6× the bare proxy's throughput is ≤ ${us(bare / 0.6)} per request; the gateway spends ${us(perRequest("off"))} (keys on: ${us(perRequest("on"))}; 0.5× is ≤ ${us(bare / 0.5)}).`,
  ].join("\n");
}

function render(
  cfg: Config,
  main: Map<string, LoadResult[]>,
  hop: Map<string, LoadResult[]>,
  pids: Record<Target["key"], number>,
  profiles: string[],
  load: { before: number; after: number },
  layers: string | undefined,
): string {
  const get = (mode: Mode, c: number, t: Target["key"]) => main.get(`${mode}|${c}|${t}`);
  const names: Record<Target["key"], string> = {
    fake: "fake vLLM (direct)",
    bare: "bare proxy",
    off: "acs-gateway",
    on: "acs-gateway, keys on",
  };
  const keys = ["fake", "bare", "off", "on"] as const;
  const proxied = ["bare", "off", "on"] as const;
  // CPU per chunk of the process that relayed it (the fake's own, for the direct calls), µs.
  const cpuPerChunkUs = (rs: LoadResult[] | undefined, t: Target["key"]) =>
    rs === undefined
      ? Number.NaN
      : median(rs.map((r) => ((r.cpuS[pids[t]] ?? Number.NaN) / (r.count * cfg.chunks)) * 1e6));

  const has = (c: number) => cfg.connections.includes(c);
  const cpuConn = has(256) ? 256 : (cfg.connections.at(-1) as number);
  const summary: string[] = [
    `| measure (median of ${cfg.rounds} interleaved round${cfg.rounds > 1 ? "s" : ""}) | bare proxy | acs-gateway | acs-gateway, keys on |`,
    "|---|---:|---:|---:|",
  ];
  if (has(1)) {
    summary.push(
      `| non-stream, 1 connection: added p50 over calling the fake directly | ${proxied
        .map((t) =>
          signed(
            paired(get("non-stream", 1, t), get("non-stream", 1, "fake"), (x, y) => x.p50Ms - y.p50Ms),
            " ms",
          ),
        )
        .join(" | ")} |`,
    );
    // Keys on, a non-streamed request is Inference's stream collected (API.md §9: a caller who
    // leaves is charged what was generated); the fake spaces its stream's chunks by an event-loop
    // turn each and answers a non-streamed request at once, where vLLM takes the same time both ways.
    summary.push(
      `| non-stream, 1 connection: added p50 over the fake's own stream (the upstream call of keys on) | — | — | ${signed(
        paired(get("non-stream", 1, "on"), get("stream", 1, "fake"), (x, y) => x.p50Ms - y.p50Ms),
        " ms",
      )} |`,
    );
  }
  for (const [mode, c] of [
    ["non-stream", 64],
    ["stream", 256],
  ] as const) {
    if (!has(c)) continue;
    summary.push(
      `| ${mode}, ${c} connections: throughput vs the bare proxy | ${proxied
        .map((t) => ratio(paired(get(mode, c, t), get(mode, c, "bare"), (x, y) => x.rps / y.rps)))
        .join(" | ")} |`,
    );
  }
  summary.push(
    `| CPU per streamed chunk (stream, ${cpuConn} connections) | ${proxied
      .map((t) => {
        const rs = get("stream", cpuConn, t);
        return `${fmtMs(cpuPerChunkUs(rs, t))} µs`;
      })
      .join(" | ")} |`,
  );
  // Each round's cell, with the latency of one kind's requests as its p50.
  const hopGet = (kind: PromptKind, t: Target["key"]) =>
    hop.get(`alternate|${t}`)?.map((r) => ({ ...r, p50Ms: r.byKind?.[kind].p50Ms ?? Number.NaN }));
  const hopAdded = (kind: PromptKind, t: Target["key"]) =>
    paired(hopGet(kind, t), hopGet(kind, "fake"), (x, y) => x.p50Ms - y.p50Ms);
  summary.push(
    `| ${cfg.hopMs} ms hop, 1 connection: added p50, new text prompt / token-id prompt | ${(
      ["bare", "off"] as const
    )
      .map((t) => `${signed(hopAdded("text", t))} / ${signed(hopAdded("ids", t))} ms`)
      .join(" | ")} | — |`,
  );

  const detail: string[] = [
    "| mode | connections | target | p50 ms | p99 ms | added p50 ms | req/s | × bare proxy (min–max) | chunks/s | CPU µs per chunk | non-2xx / errors |",
    "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const mode of ["non-stream", "stream"] as const) {
    for (const c of cfg.connections) {
      for (const t of keys) {
        const rs = get(mode, c, t);
        if (rs === undefined) continue;
        const ratios = rs.map((r, i) => r.rps / (get(mode, c, "bare")?.[i]?.rps ?? Number.NaN));
        const range = rs.length > 1 ? ` (${ratio(Math.min(...ratios))}–${ratio(Math.max(...ratios))})` : "";
        const rps = median(rs.map((r) => r.rps));
        detail.push(
          `| ${mode} | ${c} | ${names[t]} | ${fmtMs(median(rs.map((r) => r.p50Ms)))} | ${fmtMs(median(rs.map((r) => r.p99Ms)))} | ${t === "fake" ? "—" : signed(paired(rs, get(mode, c, "fake"), (x, y) => x.p50Ms - y.p50Ms))} | ${fmtInt(rps)} | ${ratio(median(ratios))}${range} | ${mode === "stream" ? fmtInt(rps * cfg.chunks) : "—"} | ${mode === "stream" ? fmtMs(cpuPerChunkUs(rs, t)) : "—"} | ${rs.reduce((a, r) => a + r.non2xx, 0)} / ${rs.reduce((a, r) => a + r.errors + r.timeouts, 0)} |`,
        );
      }
    }
  }

  const hopRows = (["text", "ids"] as const).map((kind) => {
    const p50 = (t: Target["key"]) => fmtMs(median((hopGet(kind, t) ?? []).map((r) => r.p50Ms)));
    const errs = (["fake", "bare", "off"] as const).reduce(
      (a, t) => a + (hopGet(kind, t) ?? []).reduce((b, r) => b + r.non2xx + r.errors + r.timeouts, 0),
      0,
    );
    return `| ${kind === "text" ? "new short text prompt" : "new token-id prompt"} | ${p50("fake")} | ${p50("bare")} (${signed(hopAdded(kind, "bare"))}) | ${p50("off")} (${signed(hopAdded(kind, "off"))}) | ${errs} |`;
  });
  // Per round: (gateway − fake) for a new text prompt minus (gateway − fake) for token ids.
  const rounds = (kind: PromptKind, t: Target["key"]) => hopGet(kind, t) ?? [];
  const textMinusIds = median(
    rounds("text", "off").map(
      (r, i) =>
        r.p50Ms -
        (rounds("text", "fake")[i]?.p50Ms ?? Number.NaN) -
        ((rounds("ids", "off")[i]?.p50Ms ?? Number.NaN) - (rounds("ids", "fake")[i]?.p50Ms ?? Number.NaN)),
    ),
  );

  return [
    "## Hot path: the gateway's own cost next to a bare proxy (issue 13)",
    "",
    `Separate processes on one machine of ${cpus().length} cores, shared by all of them (so every figure here includes CPU contention with the fake and the load generator): a fast fake vLLM (node:http, fixed answers; ${cfg.chunks} tokens per completion, so ${cfg.chunks} chunks per stream, each in its own write; \`data: [DONE]\` and the chunked terminator in two writes, as uvicorn), a bare proxy (node:http + undici \`Pool.stream\`, 128 upstream connections like the gateway's pool, nothing parsed), the gateway (\`${cfg.gateway.label}\`, production defaults, ACS_MODELS naming the fake) twice — keys off, and keys on (ACS_DB: SQLite on ext4, a key with a huge Budget, Authorization on every request) — and autocannon in a process of its own. Every target gets the same bytes: \`{"model", "prompt": "The sky is", "max_tokens": ${cfg.chunks}, "temperature": 0}\` (+ \`"stream": true\`); the gateway's /tokenize cache is warm after the first request. Each target was first primed with ${cfg.primeS} s of load (half non-stream, half stream, 64 connections; the profiled gateways too), so that these are steady-state figures. Each cell: ${cfg.warmupS} s warm-up, then a ${cfg.measureS} s window; latency = request written → response complete, timed per response (sub-ms). Targets are interleaved within each round (order rotated per round); every figure is the median over ${cfg.rounds} round${cfg.rounds > 1 ? "s" : ""}, differences and ratios taken within a round. CPU per chunk = CPU time of the process that relayed the chunks (/proc utime + stime, 10 ms ticks) in the window ÷ chunks of the streams completed in it. Machine load average (1 min): ${load.before.toFixed(1)} before this section, ${load.after.toFixed(1)} after (other work on the machine inflates every absolute figure).`,
    "",
    summary.join("\n"),
    "",
    detail.join("\n"),
    "",
    `### ${cfg.hopMs} ms hop: a new prompt every request`,
    "",
    `A second fake adds ${cfg.hopMs} ms before every answer (completions, /tokenize, models, health); 1 connection, non-stream; every request has a prompt never sent before, so no cache helps: a short text prompt (7 tokens with BOS; with a byte-level tokenizer the gateway's bound decides and it asks no /tokenize) and 7 token ids, in turn on the one connection, each kind's latency kept apart (so both are measured in the same window). p50 ms, (added over calling the fake directly in the same round).`,
    "",
    "| prompt | fake vLLM (direct) | bare proxy | acs-gateway | non-2xx / errors |",
    "|---|---:|---:|---:|---:|",
    ...hopRows,
    "",
    `Added p50 of a new text prompt minus that of a token-id prompt, through the gateway: ${signed(textMinusIds, " ms")} (target: ≤ 0).`,
    ...(layers === undefined ? [] : ["", layers]),
    ...(profiles.length > 0 ? ["", ...profiles.flatMap((p) => [p, ""])] : []),
  ]
    .join("\n")
    .trimEnd();
}
