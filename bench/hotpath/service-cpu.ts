/**
 * The completions service's own CPU per request, in-process: `createCompletionsService` over a
 * `createVllmClient` to the fast fake vLLM (./fake-vllm.ts, a child process so that its CPU is not
 * counted), keys off. For each case (non-stream / stream × 1 / 16 tokens) it warms up, then runs
 * requests one at a time and prints process.cpuUsage() (user + system) per request in µs, plus
 * tinybench figures of the pieces (validateRequest, toStreamChunk).
 *
 * `--in-memory`: the client answers from memory instead (no HTTP, no fake): the service alone.
 *
 * `node --import tsx bench/hotpath/service-cpu.ts [--warmup 4000] [--n 4000] [--in-memory]`
 */
import { spawn } from "node:child_process";
import { parseArgs } from "node:util";
import { create } from "@bufbuild/protobuf";
import { Bench } from "tinybench";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { loadConfig } from "../../src/config/index.js";
import { createSteeringBudget } from "../../src/lens/index.js";
import {
  admissionLimitsFrom,
  createAdmission,
  createCompletionsService,
  createModelRegistry,
} from "../../src/service/index.js";
import { validateRequest } from "../../src/service/validate-request.js";
import { createVllmClient, TextOffsets, toStreamChunk, VllmInference } from "../../src/upstream/index.js";

const { values } = parseArgs({
  options: { warmup: { type: "string" }, n: { type: "string" }, "in-memory": { type: "boolean" } },
});
const WARMUP = Number(values.warmup ?? 4000);
const N = Number(values.n ?? 4000);

const child = spawn(
  process.execPath,
  ["--import", "tsx", "bench/hotpath/fake-vllm.ts", "--port", "0", "--chunks", "16", "--exit-with-stdin"],
  { stdio: ["pipe", "pipe", "inherit"] },
);
const url = await new Promise<string>((resolve) => {
  child.stdout.on("data", (d: Buffer) => {
    const m = /listening at (\S+)/.exec(d.toString());
    if (m?.[1]) resolve(m[1]);
  });
});
// No silence bound (0), as the figures of bench/RESULTS.md were measured.
const realClient = createVllmClient({ baseUrl: url, connections: 4, silenceTimeoutMs: 0 });
/** `--in-memory`: a client that answers from memory (no HTTP): the service's own cost alone. */
const memoryClient = {
  ...realClient,
  tokenize: async () => ({ count: 4, tokens: [128000, 1, 2, 3], maxModelLen: 4096 }),
  async *stream(body: { max_tokens?: number }) {
    const n = body.max_tokens ?? 16;
    for (let k = 0; k < n; k++) {
      yield {
        id: "cmpl-up",
        object: "text_completion",
        created: 1,
        model: "bench-model",
        choices: [
          {
            index: 0,
            text: " sky",
            logprobs: null,
            finish_reason: k === n - 1 ? "length" : null,
            stop_reason: null,
            prompt_logprobs: null,
            prompt_token_ids: k === 0 ? [128000, 1, 2, 3] : null,
            token_ids: [1000 + k],
          },
        ],
        usage: null,
      } as never;
    }
    yield {
      id: "cmpl-up",
      object: "text_completion",
      created: 1,
      model: "bench-model",
      choices: [],
      usage: { prompt_tokens: 4, completion_tokens: n, total_tokens: 4 + n },
    } as never;
  },
};
const client = values["in-memory"] ? memoryClient : realClient;
const registry = createModelRegistry(
  [
    {
      id: "bench-model",
      aliases: [],
      upstreams: [{ url, weight: 1 }],
      servedModelName: "bench-model",
      maxModelLen: 4096,
      hiddenSize: 4096,
      numLayers: 32,
      ownedBy: "acs",
    } as never,
  ],
  () => new VllmInference(Object.assign(client, { serving: () => true })),
);
// Every setting at its default (what the gateway runs with an empty environment).
const defaults = loadConfig({});
const api = createCompletionsService({
  models: registry,
  ledger: undefined,
  nonStreamDeadlineMs: defaults.nonStreamDeadlineMs,
  holdRenewIntervalMs: defaults.holdRenewMs,
  lensFanOutConcurrency: defaults.lensFanOutConcurrency,
  steeringBudget: createSteeringBudget({
    requestBytes: defaults.steeringRequestBytes,
    processBytes: defaults.steeringProcessBytes,
  }),
  admission: createAdmission(admissionLimitsFrom(defaults)),
});

const request = (maxTokens: number) =>
  create(CreateCompletionRequestSchema, {
    model: "bench-model",
    prompt: { case: "text", value: "The sky is" },
    maxTokens,
  });
const ctx = () => ({
  requestId: "req_0123456789abcdef0123456789abcdef",
  signal: new AbortController().signal,
  authorization: undefined,
  setResponseHeader() {},
});

async function once(stream: boolean, tokens: number) {
  const r = request(tokens);
  if (!stream) {
    await api.createCompletion(r, ctx());
    return;
  }
  for await (const _ of api.streamCompletion(r, ctx())) {
    // drained
  }
}

const CASES = process.env.SERVICE_CPU_CASES; // e.g. "false:1" (a profile of one case)
for (const [stream, tokens] of [
  [false, 1],
  [false, 16],
  [true, 1],
  [true, 16],
] as const) {
  if (CASES !== undefined && !CASES.split(",").includes(`${stream}:${tokens}`)) continue;
  for (let i = 0; i < WARMUP; i++) await once(stream, tokens);
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < N; i++) await once(stream, tokens);
  const c = process.cpuUsage(c0);
  const wall = Number(process.hrtime.bigint() - t0) / 1e3 / N;
  console.log(
    `${stream ? "stream    " : "non-stream"} ${String(tokens).padStart(2)} tokens: ${((c.user + c.system) / N).toFixed(1)} µs CPU/request (wall ${wall.toFixed(1)} µs)`,
  );
}

const r = request(16);
const chunk = {
  id: "cmpl-x",
  object: "text_completion",
  created: 1,
  model: "bench-model",
  choices: [
    {
      index: 0,
      text: " sky",
      logprobs: null,
      finish_reason: null,
      stop_reason: null,
      prompt_logprobs: null,
      prompt_token_ids: null,
      token_ids: [1001],
    },
  ],
  usage: null,
} as never;
const ids = { id: "cmpl-0123", created: 1n, model: "bench-model" };
const offsets = new TextOffsets();
const bench = new Bench({ time: 1000, warmupTime: 500 });
bench.add("validateRequest", () => validateRequest(r));
bench.add("toStreamChunk", () => toStreamChunk(chunk, ids, offsets));
await bench.run();
for (const t of bench.tasks) {
  const res = t.result as { latency?: { mean: number }; mean?: number } | undefined;
  const mean = res?.latency?.mean ?? res?.mean ?? Number.NaN;
  console.log(`${t.name}: ${(mean * 1000).toFixed(2)} µs/call`, (res as { error?: unknown })?.error ?? "");
}
child.stdin.end();
child.kill();
process.exit(0);
