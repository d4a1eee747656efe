// Usage when Inference reports none (issue 32): the gateway's own count, on every surface, streamed
// (include_usage, continuous_usage_stats) or not, one request or a lens fan-out, keys on or off.
// Inference is the real reference engine behind a proxy that deletes every `usage` it sends; the
// same request through a gateway that reaches the engine directly gives the usage to expect, and
// with keys on the Budget is charged exactly that.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fromJson, type JsonObject, toJson } from "@bufbuild/protobuf";
import { createClient, type Transport } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
} from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CompletionsService,
  CreateCompletionRequestSchema,
  CreateCompletionResponseSchema,
  StreamCompletionResponseSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

let dir: string;
let engine: RunningEngine;
let proxy: Server;
/** Reach the engine directly: the usage Inference reports, and what a key is charged with it. */
let direct: Stack;
let directKeyed: Stack;
let directKey: string;
let directKeyId: string;
/** Through the proxy, keys on and off. */
let keyed: Stack;
let open: Stack;
let key: string;
let keyId: string;
/** Inference's answers the proxy stripped a usage from (the test's own check that it ran). */
let stripped = 0;

/** An Inference answer with every `usage` deleted (and a usage-only chunk dropped). */
function withoutUsage(body: string, sse: boolean): string {
  const strip = (json: Record<string, unknown>) => {
    if ("usage" in json && json.usage !== null) stripped++;
    delete json.usage;
    return json;
  };
  if (!sse) return JSON.stringify(strip(JSON.parse(body) as Record<string, unknown>));
  const events = body.split("\n\n").filter((e) => e.trim() !== "");
  const kept: string[] = [];
  for (const event of events) {
    if (!event.startsWith("data: {")) {
      kept.push(event);
      continue;
    }
    const json = strip(JSON.parse(event.slice("data: ".length)) as Record<string, unknown>);
    const onlyUsage = Array.isArray(json.choices) && json.choices.length === 0 && !("activations" in json);
    if (!onlyUsage) kept.push(`data: ${JSON.stringify(json)}`);
  }
  return `${kept.join("\n\n")}\n\n`;
}

/** A proxy to `target` that removes usage from /v1/completions answers (buffered: a test's bodies are small). */
async function startStrippingProxy(target: string): Promise<Server> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      try {
        const headers = Object.fromEntries(
          Object.entries(req.headers).filter(
            (e): e is [string, string] =>
              typeof e[1] === "string" && e[0] !== "host" && e[0] !== "content-length",
          ),
        );
        const up = await fetch(`${target}${req.url}`, {
          method: req.method ?? "GET",
          headers,
          ...(req.method === "GET" ? {} : { body: Buffer.concat(chunks) }),
        });
        const type = up.headers.get("content-type") ?? "application/json";
        let body = await up.text();
        if (req.url === "/v1/completions" && up.status === 200)
          body = withoutUsage(body, type.includes("event-stream"));
        res.writeHead(up.status, { "content-type": type });
        res.end(body);
      } catch {
        res.destroy();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-usage-none-"));
  engine = await startEngine({ preset: "tiny" });
  proxy = await startStrippingProxy(engine.url);
  const model = {
    id: engine.model.id,
    servedModelName: engine.model.id,
    maxModelLen: engine.model.maxModelLen,
    hiddenSize: engine.model.hiddenSize,
    numLayers: engine.model.numLayers,
  };
  const proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
  direct = await startStack({ upstreamUrl: engine.url, model });
  directKeyed = await startStack({ upstreamUrl: engine.url, model, dbPath: join(dir, "direct.db") });
  ({ key: directKey, id: directKeyId } = await directKeyed.ledger!.createKey({ budgetTokens: 10_000_000 }));
  open = await startStack({ upstreamUrl: proxyUrl, model });
  keyed = await startStack({ upstreamUrl: proxyUrl, model, dbPath: join(dir, "keys.db") });
  ({ key, id: keyId } = await keyed.ledger!.createKey({ budgetTokens: 10_000_000 }));
});
afterAll(async () => {
  await Promise.all([direct?.close(), directKeyed?.close(), open?.close(), keyed?.close()]);
  await new Promise((resolve) => proxy?.close(resolve));
  await engine?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The requests, as REST bodies (the proto requests are their proto JSON below). */
const cases: Record<string, Record<string, unknown>> = {
  "one prompt": { prompt: "The cat sat", max_tokens: 7, temperature: 0, ignore_eos: true },
  "two prompts, n 2": { prompt: ["Hello there", "A b c"], n: 2, max_tokens: 5, seed: 7, ignore_eos: true },
  "lens fan-out": {
    prompt: ["Hello there", "A b c"],
    max_tokens: 4,
    seed: 11,
    ignore_eos: true,
    output_residual_stream: [0],
  },
};

/** A REST body as proto JSON (the prompt oneof and the layer list are shaped differently). */
function protoJson(body: Record<string, unknown>, model: string): JsonObject {
  const { prompt, output_residual_stream: layers, stream_options: options, ...rest } = body;
  return {
    ...(rest as JsonObject),
    model,
    ...(Array.isArray(prompt) ? { texts: { values: prompt as string[] } } : { text: prompt as string }),
    ...(layers === undefined ? {} : { output_residual_stream: { layer_indices: layers as number[] } }),
    ...(options === undefined ? {} : { stream_options: options as JsonObject }),
  };
}

/** The request's usage, and each text chunk's (continuous_usage_stats) as [choice index, usage]. */
type Answer = { usage: Usage | undefined; perChunk: Array<[number, Usage | undefined]> };

/** Chunks by choice, each choice's in order: a fan-out's choices interleave as their requests run. */
const byChoice = (chunks: Answer["perChunk"]) => chunks.slice().sort((a, b) => a[0] - b[0]);

async function restCall(stack: Stack, body: Record<string, unknown>, auth?: string): Promise<Answer> {
  const res = await fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(auth ? { authorization: `Bearer ${auth}` } : {}) },
    body: JSON.stringify({ model: stack.alias, ...body }),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  if (body.stream !== true)
    return { usage: (JSON.parse(text) as { usage: Usage }).usage ?? undefined, perChunk: [] };
  const chunks = sseChunks<{ choices: Array<{ index: number }>; usage: Usage | null }>(text);
  const last = chunks.filter((c) => c.choices.length === 0 && c.usage !== null).at(-1);
  const perChunk = chunks
    .filter((c) => c.choices.length > 0)
    .map((c): [number, Usage | undefined] => [c.choices[0]?.index ?? -1, c.usage ?? undefined]);
  return { usage: last?.usage ?? undefined, perChunk };
}

const protoUsage = (u: unknown): Usage | undefined => (u === undefined ? undefined : (u as Usage));

async function rpcCall(
  transport: Transport,
  stack: Stack,
  body: Record<string, unknown>,
  auth?: string,
): Promise<Answer> {
  const client = createClient(CompletionsService, transport);
  const { stream, ...rest } = body;
  const request = fromJson(CreateCompletionRequestSchema, protoJson(rest, stack.alias));
  const headers = auth ? { authorization: `Bearer ${auth}` } : {};
  if (stream !== true) {
    const res = toJson(CreateCompletionResponseSchema, await client.createCompletion(request, { headers }), {
      useProtoFieldName: true,
    }) as { usage?: unknown };
    return { usage: protoUsage(res.usage), perChunk: [] };
  }
  let usage: Usage | undefined;
  const perChunk: Answer["perChunk"] = [];
  for await (const chunk of client.streamCompletion(request, { headers })) {
    const json = toJson(StreamCompletionResponseSchema, chunk, { useProtoFieldName: true }) as {
      choices?: Array<{ index?: number }>;
      usage?: unknown;
    };
    if ((json.choices ?? []).length === 0) usage = protoUsage(json.usage) ?? usage;
    else perChunk.push([json.choices?.[0]?.index ?? 0, protoUsage(json.usage)]);
  }
  return { usage, perChunk };
}

let h2: Http2SessionManager[] = [];
type Surface = (stack: Stack, body: Record<string, unknown>, auth?: string) => Promise<Answer>;
const surfaces: Record<string, Surface> = {
  rest: restCall,
  "connect json": (s, b, a) =>
    rpcCall(createConnectTransport({ baseUrl: s.url, httpVersion: "1.1", useBinaryFormat: false }), s, b, a),
  grpc: (s, b, a) => {
    const session = new Http2SessionManager(s.url);
    h2.push(session);
    return rpcCall(createGrpcTransport({ baseUrl: s.url, sessionManager: session }), s, b, a);
  },
  "grpc-web": (s, b, a) => rpcCall(createGrpcWebTransport({ baseUrl: s.url, httpVersion: "1.1" }), s, b, a),
};
afterAll(() => {
  for (const session of h2) session.abort();
  h2 = [];
});

const variants: Array<[string, Record<string, unknown>]> = [
  ["unary", {}],
  ["stream", { stream: true, stream_options: { include_usage: true } }],
  [
    "stream, continuous",
    { stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } },
  ],
];

describe.each(Object.keys(surfaces))("%s: Inference reports no usage", (surface) => {
  const call = surfaces[surface]!;
  it.each(Object.keys(cases).flatMap((c) => variants.map(([v, extra]) => [c, v, extra] as const)))(
    "%s, %s: the gateway's count is Inference's usage, and a key is charged as with it",
    async (name, _variant, extra) => {
      const body = { ...cases[name], ...extra };
      const before = stripped;
      const expected = await call(direct, body);
      expect(expected.usage).toBeDefined();
      const keysOff = await call(open, body);
      const spent = (await keyed.ledger!.usage(keyId)).spentTokens;
      const keysOn = await call(keyed, body, key);
      const directSpent = (await directKeyed.ledger!.usage(directKeyId)).spentTokens;
      await call(directKeyed, body, directKey);
      const charge = (await directKeyed.ledger!.usage(directKeyId)).spentTokens - directSpent;
      expect(stripped, "the proxy took Inference's usage away").toBeGreaterThan(before);
      expect(keysOff.usage).toEqual(expected.usage);
      expect(keysOn.usage).toEqual(expected.usage);
      expect((await keyed.ledger!.usage(keyId)).spentTokens - spent).toBe(charge);
      // The charge is the usage, but for a streamed capture's replays (proto/API.md §9).
      const replays = body.stream === true && body.output_residual_stream !== undefined;
      if (!replays) expect(charge).toBe(expected.usage?.total_tokens);
      if (extra.stream_options && (extra.stream_options as Record<string, boolean>).continuous_usage_stats) {
        expect(byChoice(keysOff.perChunk)).toEqual(byChoice(expected.perChunk));
        expect(byChoice(keysOn.perChunk)).toEqual(byChoice(expected.perChunk));
      }
    },
  );
});
