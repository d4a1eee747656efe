/**
 * CPU per upstream stream and per streamed chunk in the Inference client and the replica pool,
 * in-process: the fake vLLM (bench/hotpath/fake-vllm.ts) runs as a child process so that its CPU
 * is not counted. Streams run one after another (one connection) through
 * `createVllmClient(...).stream` and through a one-replica `createUpstreamPool(...).stream`, with
 * 1 and 16 chunks, after a warm-up; prints µs of this process's CPU (user + system,
 * process.cpuUsage) per stream, and the per-chunk slope between 1 and 16 chunks.
 *
 * `node --import tsx bench/hotpath/upstream-stream.ts [--streams 20000] [--warmup 5000]`
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import { parseArgs } from "node:util";
import { createUpstreamPool } from "../../src/upstream/pool/index.js";
import { createVllmClient } from "../../src/upstream/vllm/create-vllm-client.js";
import type { VllmCompletionRequest } from "../../src/upstream/vllm/types.js";
import type { VllmClient } from "../../src/upstream/vllm/vllm-client-types.js";

const { values } = parseArgs({
  options: { streams: { type: "string", default: "20000" }, warmup: { type: "string", default: "5000" } },
});
const streams = Number(values.streams);
const warmup = Number(values.warmup);

const fake = spawn(
  process.execPath,
  [
    "--import",
    "tsx",
    new URL("./fake-vllm.ts", import.meta.url).pathname,
    "--port",
    "0",
    "--chunks",
    "16",
    "--exit-with-stdin",
  ],
  { stdio: ["pipe", "pipe", "inherit"] },
);
let out = "";
fake.stdout.setEncoding("utf8");
while (!/listening at (\S+)/.test(out)) {
  const [chunk] = (await once(fake.stdout, "data")) as [string];
  out += chunk;
}
const baseUrl = (/listening at (\S+)/.exec(out) as RegExpExecArray)[1] as string;

const body = (maxTokens: number): VllmCompletionRequest => ({
  model: "bench-model",
  prompt: "hello",
  max_tokens: maxTokens,
  n: 1,
  temperature: 1,
  top_p: 1,
  top_k: -1,
  min_p: 0,
  repetition_penalty: 1,
  presence_penalty: 0,
  frequency_penalty: 0,
  min_tokens: 0,
  ignore_eos: false,
  stop: [],
  stop_token_ids: [],
  include_stop_str_in_output: false,
  skip_special_tokens: true,
  spaces_between_special_tokens: true,
  add_special_tokens: true,
  echo: false,
  return_token_ids: false,
  stream: true,
});

async function run(client: VllmClient, n: number, maxTokens: number): Promise<number> {
  const b = body(maxTokens);
  const signal = new AbortController().signal;
  let chunks = 0;
  const start = process.cpuUsage();
  for (let i = 0; i < n; i++) {
    for await (const _ of client.stream(b, { signal, upstreamRequestId: `bench-${i}` })) chunks++;
  }
  const used = process.cpuUsage(start);
  if (chunks !== n * maxTokens) throw new Error(`expected ${n * maxTokens} chunks, got ${chunks}`);
  return (used.user + used.system) / n;
}

// No silence bound (0), as the figures of bench/RESULTS.md were measured.
const client = createVllmClient({ baseUrl, silenceTimeoutMs: 0 });
const pool = createUpstreamPool({
  model: "bench-model",
  replicas: [{ url: baseUrl, client: createVllmClient({ baseUrl, silenceTimeoutMs: 0 }) }],
  healthIntervalMs: 0,
});
await pool.ready();
for (const [name, c] of [
  ["client", client],
  ["pool", pool],
] as const) {
  await run(c, warmup, 16);
  await run(c, warmup, 1);
  const results: string[] = [];
  for (let round = 0; round < 2; round++) {
    const one = await run(c, streams / 2, 1);
    const sixteen = await run(c, streams / 2, 16);
    results.push(
      `${one.toFixed(1)} µs/stream (1 chunk), ${sixteen.toFixed(1)} µs/stream (16 chunks), ${((sixteen - one) / 15).toFixed(2)} µs/chunk`,
    );
  }
  console.log(`${name}: ${results.join(" | ")}`);
}
await client.close();
await pool.close();
fake.stdin.end();
