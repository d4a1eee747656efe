/**
 * `npm run bench -- ab --a "node ../old/dist/src/main.js" --b "node dist/src/main.js"`: two builds
 * of the gateway side by side, in one run, in front of the bench's fast fake vLLM — what one change
 * costs. Not part of a full `npm run bench` (it needs the two commands).
 *
 * Each build runs as production does (ACS_WORKERS=1, ACS_MODELS naming the fake; with `--keys on`
 * also ACS_DB: a SQLite file and a key with a huge Budget), with its own working directory (the
 * directory of its entry's `dist/`). Each build runs as two processes, started in the orders A, B
 * then B, A: the process started second costs more on this VM (a build against an identical copy
 * of itself read 1.13 when the copy was always started second), and with both orders that bias
 * cancels. Each process is primed with 8 s of 64-connection load. Then `--rounds` rounds (default
 * 8) of one window per process (`--duration`, default 3 s; 0.5 s of warm-up), in turn, the order
 * swapped every round. Reported per build: the median CPU per streamed chunk (`--mode stream`, the
 * default) or per request (`--mode non-stream`) — process CPU from /proc over the window ÷ the
 * work done in it — and req/s; and the median over the rounds of B ÷ A (per round: the geometric
 * mean of the two pairs' ratios; the VM's speed drifts by ±20% from one window to the next, a
 * ratio within a round much less). `--connections` (default 64) and `--chunks` (tokens per
 * completion, default 16) as in the hotpath section.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createBudgetLedger } from "../../src/budget/index.js";
import { freePort } from "../../test/helpers/processes.js";
import type { SectionOptions } from "./hotpath.js";
import { gatewayCommand } from "./hotpath.js";
import { type LoadWorker, startLoadWorker } from "./load-worker.js";
import { type ServerProcess, spawnServer } from "./processes.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const MODEL = "bench-model";

/** An option's text, trimmed; undefined when absent or blank. */
export function option(o: SectionOptions, key: string): string | undefined {
  const v = o[key];
  return typeof v === "string" && v.trim() !== "" ? v.trim() : undefined;
}

/** A positive number option (`fallback` when absent); throws on anything else. */
export function positive(o: SectionOptions, key: string, fallback: number): number {
  const v = option(o, key);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${key} must be a positive number, got ${v}`);
  return n;
}

/** The median of `xs` (non-empty). */
export const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((p, q) => p - q);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
};

/** The directory a gateway command runs in: the checkout whose `dist/` holds its entry. */
function checkoutOf(argv: string[]): string {
  const entry = argv.find((a) => a.endsWith(".js"));
  if (entry === undefined) return ROOT;
  const parts = resolve(entry).split("/");
  const dist = parts.lastIndexOf("dist");
  return dist > 0 ? parts.slice(0, dist).join("/") : dirname(resolve(entry));
}

export async function benchAb(options: SectionOptions = {}): Promise<string> {
  const a = option(options, "a");
  const b = option(options, "b");
  if (a === undefined || b === undefined) {
    throw new Error(
      'ab needs the two gateway commands: --a "node OLD/dist/src/main.js" --b "node dist/src/main.js"',
    );
  }
  const mode = option(options, "mode") ?? "stream";
  if (mode !== "stream" && mode !== "non-stream")
    throw new Error(`--mode must be stream or non-stream, got ${mode}`);
  const keys = option(options, "keys") ?? "off";
  if (keys !== "on" && keys !== "off") throw new Error(`--keys must be on or off, got ${keys}`);
  const rounds = positive(options, "rounds", 8);
  const measureS = positive(options, "duration", 3);
  const connections = positive(options, "connections", 64);
  const chunks = positive(options, "chunks", 16);

  const dir = mkdtempSync(join(tmpdir(), "acs-ab-"));
  const servers: ServerProcess[] = [];
  let worker: LoadWorker | undefined;
  try {
    const fake = await spawnServer("fake-vllm", [
      process.execPath,
      "--import",
      "tsx",
      join(ROOT, "bench/hotpath/fake-vllm.ts"),
      "--model",
      MODEL,
      "--chunks",
      String(chunks),
      "--exit-with-stdin",
    ]);
    servers.push(fake);
    const models = join(dir, "models.json");
    writeFileSync(
      models,
      JSON.stringify({
        models: [
          {
            id: MODEL,
            upstream_url: fake.url,
            hidden_size: 4096,
            num_hidden_layers: 32,
            byte_level_tokenizer: true,
          },
        ],
      }),
    );
    const env: Record<string, string> = { ACS_MODELS: models, ACS_WORKERS: "1" };
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (keys === "on") {
      const db = join(dir, "keys.db");
      const ledger = await createBudgetLedger({ path: db, reclaimIntervalMs: 0 });
      const { key } = await ledger.createKey({ name: "bench", budgetTokens: 1_000_000_000_000 });
      await ledger.close();
      env.ACS_DB = db;
      headers.authorization = `Bearer ${key}`;
    }
    const start = async (name: string, command: string) => {
      const { argv } = gatewayCommand(command);
      const port = await freePort();
      const s = await spawnServer(name, argv, {
        cwd: checkoutOf(argv),
        env: { ...env, PORT: String(port) },
        url: `http://127.0.0.1:${port}`,
        readyPath: "/readyz",
      });
      servers.push(s);
      return s;
    };
    // Pair 1 started A then B, pair 2 B then A (the start order's bias cancels).
    const a1 = await start("A (1st)", a);
    const b1 = await start("B (2nd)", b);
    const b2 = await start("B (1st)", b);
    const a2 = await start("A (2nd)", a);
    const pairs = [
      { A: a1, B: b1 },
      { A: a2, B: b2 },
    ];
    worker = await startLoadWorker();
    const body = JSON.stringify({
      model: MODEL,
      prompt: "The sky is",
      max_tokens: chunks,
      temperature: 0,
      stream: mode === "stream",
    });
    const load = worker;
    const run = (s: ServerProcess, windowS: number, c: number) =>
      load.run({
        url: s.url,
        headers,
        body,
        connections: c,
        warmupS: 0.5,
        measureS: windowS,
        cpuPids: [s.pid],
      });
    for (const s of [a1, b1, b2, a2]) await run(s, 8, 64); // primed: V8 optimizes for seconds
    const cost: Record<"A" | "B", number[]> = { A: [], B: [] };
    const rps: Record<"A" | "B", number[]> = { A: [], B: [] };
    const ratios: number[] = [];
    const failures: string[] = [];
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? (["A", "B"] as const) : (["B", "A"] as const);
      let product = 1;
      for (const [p, pair] of pairs.entries()) {
        const got = { A: Number.NaN, B: Number.NaN };
        for (const k of order) {
          const s = pair[k];
          const x = await run(s, measureS, connections);
          if (x.non2xx + x.errors > 0)
            failures.push(`${k} (pair ${p + 1}) round ${r + 1}: ${x.non2xx} non-2xx, ${x.errors} errors`);
          const work = mode === "stream" ? x.count * chunks : x.count;
          got[k] = ((x.cpuS[s.pid] ?? Number.NaN) * 1e6) / work;
          cost[k].push(got[k]);
          rps[k].push(x.rps);
        }
        product *= got.B / got.A;
      }
      ratios.push(Math.sqrt(product)); // the geometric mean of the two pairs' ratios
    }
    const ratio = median(ratios);
    const unit = mode === "stream" ? "chunk" : "request";
    return [
      `## A/B: two gateway builds, ${mode}, keys ${keys}, ${connections} connections`,
      "",
      `A: \`${a}\`; B: \`${b}\`. Each build as two processes (started A, B, then B, A); ${rounds} rounds of a ${measureS} s window per process, in turn (the order swapped every round), each process primed with 8 s of load; medians over the rounds.`,
      "",
      `| build | CPU µs per ${unit} (median) | req/s (median) |`,
      "|---|---:|---:|",
      `| A | ${median(cost.A).toFixed(1)} | ${Math.round(median(rps.A))} |`,
      `| B | ${median(cost.B).toFixed(1)} | ${Math.round(median(rps.B))} |`,
      "",
      `B ÷ A, CPU per ${unit}, median of the rounds' ratios: **${ratio.toFixed(3)}** (per round, the geometric mean of the two pairs': ${ratios.map((x) => x.toFixed(2)).join(", ")}).`,
      ...(failures.length > 0 ? ["", `Failures: ${failures.join("; ")}.`] : []),
    ].join("\n");
  } finally {
    worker?.close();
    await Promise.all(servers.map((s) => s.stop()));
    rmSync(dir, { recursive: true, force: true });
  }
}
