/**
 * `npm run bench -- parse-stall`: how long `/healthz` waits on the same gateway process while three
 * max-size bodies (≈7.5 MB, under the 8 MiB cap) whose prompt list can never pass the 32,000 cap
 * (proto/API.md §3) are refused at once. One gateway child (src/main.ts, ACS_WORKERS=1); a client
 * polls `/healthz` one request after another over a kept-alive connection, while three such bodies
 * go out together, for a few rounds per body shape. Figures: p99 and worst `/healthz` latency of
 * the rounds (median over rounds), and how long the refusals took.
 *
 *   npx tsx bench/parse-stall.ts    prints the markdown section
 *   benchParseStall()               returns it (for bench/run.ts)
 */

import http from "node:http";
import { fileURLToPath } from "node:url";
import { create, toBinary } from "@bufbuild/protobuf";
import { CreateCompletionRequestSchema } from "../gen/acs/v1/completions_pb.js";
import { soakModel, startGatewayChild, startScriptedUpstream } from "./soak-gateway.js";

const TARGET_BYTES = 7.5e6;
const ROUNDS = 5;
const UNARY = "/acs.v1.CompletionsService/CreateCompletion";

interface Shape {
  readonly name: string;
  readonly path: string;
  readonly contentType: string;
  readonly body: Buffer;
}

/** Short prompts (`"p1"`), as many as fill about TARGET_BYTES of JSON. */
function shortPrompts(bytesEach: number): string[] {
  return Array.from({ length: Math.floor(TARGET_BYTES / bytesEach) }, (_, i) => `p${i % 10}`);
}

function shapes(): Shape[] {
  const model = soakModel.id;
  const texts = shortPrompts(5);
  const lists = Array.from({ length: Math.floor(TARGET_BYTES / 4) }, (_, i) => [i % 10]);
  const binary = toBinary(
    CreateCompletionRequestSchema,
    create(CreateCompletionRequestSchema, {
      model,
      maxTokens: 1,
      prompt: { case: "texts", value: { values: shortPrompts(4) } },
    }),
  );
  return [
    {
      name: `REST, ${texts.length.toLocaleString("en")} strings`,
      path: "/v1/completions",
      contentType: "application/json",
      body: Buffer.from(JSON.stringify({ model, prompt: texts, max_tokens: 1 })),
    },
    {
      name: `REST, ${lists.length.toLocaleString("en")} token-id lists`,
      path: "/v1/completions",
      contentType: "application/json",
      body: Buffer.from(JSON.stringify({ model, prompt: lists, max_tokens: 1 })),
    },
    {
      name: `Connect JSON, ${texts.length.toLocaleString("en")} strings`,
      path: UNARY,
      contentType: "application/json",
      body: Buffer.from(JSON.stringify({ model, texts: { values: texts }, maxTokens: 1 })),
    },
    {
      name: `Connect binary (application/proto), ${shortPrompts(4).length.toLocaleString("en")} strings`,
      path: UNARY,
      contentType: "application/proto",
      body: Buffer.from(binary),
    },
  ];
}

/** POSTs `shape`'s body on a connection of its own; resolves with the status once answered. */
function post(url: string, shape: Shape): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      `${url}${shape.path}`,
      {
        method: "POST",
        agent: false,
        headers: { "content-type": shape.contentType, "content-length": shape.body.length },
      },
      (res) => {
        res.resume();
        res.on("end", () => resolve(res.statusCode ?? 0));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(shape.body);
  });
}

function healthz(url: string, agent: http.Agent): Promise<void> {
  return new Promise((resolve, reject) => {
    http
      .get(`${url}/healthz`, { agent }, (res) => {
        res.resume();
        res.on("end", () => resolve());
        res.on("error", reject);
      })
      .on("error", reject);
  });
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

function median(values: readonly number[]): number {
  return quantile(
    [...values].sort((a, b) => a - b),
    0.5,
  );
}

interface Round {
  p99: number;
  worst: number;
  refusedMs: number;
  statuses: number[];
}

/** Three bodies of `shape` at once, `/healthz` polled meanwhile. */
async function round(url: string, shape: Shape, agent: http.Agent): Promise<Round> {
  const latencies: number[] = [];
  let done = false;
  const polling = (async () => {
    while (!done) {
      const t = performance.now();
      await healthz(url, agent);
      latencies.push(performance.now() - t);
    }
  })();
  const start = performance.now();
  const statuses = await Promise.all([post(url, shape), post(url, shape), post(url, shape)]);
  const refusedMs = performance.now() - start;
  done = true;
  await polling;
  latencies.sort((a, b) => a - b);
  return { p99: quantile(latencies, 0.99), worst: latencies.at(-1) ?? Number.NaN, refusedMs, statuses };
}

export async function benchParseStall(): Promise<string> {
  const upstream = await startScriptedUpstream();
  const gateway = await startGatewayChild(upstream.url);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const lines = [
    "## Parse stall: /healthz while prompt lists no cap allows are refused (`npm run bench -- parse-stall`)",
    "",
    `One gateway process; three bodies of one shape sent at once, ${ROUNDS} rounds each (after one warm-up round); \`/healthz\` polled back to back meanwhile. Medians over the rounds.`,
    "",
    "| body (≈7.5 MB, max_tokens 1) | status | /healthz p99 | /healthz worst | three refused in |",
    "| --- | --- | ---: | ---: | ---: |",
  ];
  try {
    for (const shape of shapes()) {
      await round(gateway.url, shape, agent);
      const rounds: Round[] = [];
      for (let r = 0; r < ROUNDS; r++) rounds.push(await round(gateway.url, shape, agent));
      const statuses = [...new Set(rounds.flatMap((r) => r.statuses))].join(", ");
      const ms = (pick: (r: Round) => number) => `${median(rounds.map(pick)).toFixed(0)} ms`;
      lines.push(
        `| ${shape.name} (${(shape.body.length / 1e6).toFixed(1)} MB) | ${statuses} | ${ms((r) => r.p99)} | ${ms((r) => r.worst)} | ${ms((r) => r.refusedMs)} |`,
      );
    }
  } finally {
    agent.destroy();
    await gateway.stop();
    await upstream.close();
  }
  return lines.join("\n");
}

if (process.argv[1] === fileURLToPath(import.meta.url)) console.log(await benchParseStall());
