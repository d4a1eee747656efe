/**
 * CPU per REST request of the gateway, in-process: the gateway (buildApp, keys off, logger at info
 * into a null sink) against the fake vLLM (bench/hotpath/fake-vllm.ts, in a child process so its
 * CPU is not counted), an undici client in this process on one connection, sequential requests.
 * Prints process.cpuUsage() (user + system, this process: gateway + client) per request (min and
 * median of 5 rounds of `--requests`; an eighth of them for 256 chunks) for a non-stream completion
 * of 1 token and streams of 16 and 256 chunks (their difference / 240: the CPU per chunk), after a
 * warm-up. The machine's other load shows in the figures: compare A/B runs interleaved.
 *
 * Run: `node --import tsx bench/hotpath/rest-cpu.ts [--warmup 4000] [--requests 2000]`.
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import { Writable } from "node:stream";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { Pool } from "undici";
import { buildApp } from "../../src/app/build-app.js";
import { loadConfig } from "../../src/config/index.js";

const { values } = parseArgs({
  options: {
    warmup: { type: "string", default: "4000" },
    requests: { type: "string", default: "2000" },
  },
});
const warmup = Number(values.warmup);
const requests = Number(values.requests);

const fake = spawn(
  process.execPath,
  ["--import", "tsx", "bench/hotpath/fake-vllm.ts", "--chunks", "256", "--exit-with-stdin"],
  {
    stdio: ["pipe", "pipe", "inherit"],
  },
);
const [line] = (await once(fake.stdout, "data")) as [Buffer];
const fakeUrl = /http:\/\/\S+/.exec(line.toString())?.[0] ?? "";

const sink = new Writable({ write: (_c, _e, cb) => cb() });
const { app } = await buildApp(
  {
    // Every setting at its default (what the gateway runs with an empty environment).
    ...loadConfig({}),
    models: [
      {
        id: "bench-model",
        aliases: [],
        upstreams: [{ url: fakeUrl, weight: 1, apiKey: undefined }],
        servedModelName: "bench-model",
        maxModelLen: 4096,
        hiddenSize: 64,
        numLayers: 4,
        ownedBy: "bench",
      },
    ],
    db: undefined,
  },
  { logger: pino({ level: "info" }, sink), healthIntervalMs: 0 },
);
const address = await app.listen({ host: "127.0.0.1", port: 0 });
const client = new Pool(address, { connections: 1 });

const bodies = {
  unary: JSON.stringify({ model: "bench-model", prompt: "Hello there", max_tokens: 1 }),
  stream: JSON.stringify({ model: "bench-model", prompt: "Hello there", max_tokens: 16, stream: true }),
  stream256: JSON.stringify({ model: "bench-model", prompt: "Hello there", max_tokens: 256, stream: true }),
};

async function one(body: string): Promise<void> {
  const res = await client.request({
    path: "/v1/completions",
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`${res.statusCode} ${text}`);
}

async function run(kind: keyof typeof bodies, n: number): Promise<number> {
  const before = process.cpuUsage();
  for (let i = 0; i < n; i++) await one(bodies[kind]);
  const d = process.cpuUsage(before);
  return (d.user + d.system) / n;
}

const medians: Partial<Record<keyof typeof bodies, number>> = {};
for (const kind of ["unary", "stream", "stream256"] as const) {
  const n = kind === "stream256" ? Math.ceil(requests / 8) : requests;
  await run(kind, kind === "stream256" ? Math.ceil(warmup / 8) : warmup);
  const rounds: number[] = [];
  for (let r = 0; r < 5; r++) rounds.push(await run(kind, n));
  rounds.sort((x, y) => x - y);
  medians[kind] = rounds[2] ?? 0;
  console.log(
    `${kind}: min ${rounds[0]?.toFixed(0)} µs, median ${rounds[2]?.toFixed(0)} µs CPU per request (gateway + client)`,
  );
}
const perChunk = ((medians.stream256 ?? 0) - (medians.stream ?? 0)) / 240;
console.log(`per chunk (stream of 256 − stream of 16, / 240): ${perChunk.toFixed(1)} µs (gateway + client)`);
await client.close();
await app.close();
fake.stdin?.end();
