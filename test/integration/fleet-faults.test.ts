// Faulty replicas listed first beside a real reference engine (issue 33): a replica that accepts
// completions and never answers, one that resets after two chunks, one that drips a byte a second.
// Each is a small node:http server that answers Inference's ops routes (`/health`, `/v1/models`,
// `/tokenize`) as the engine does — it forwards them to it — and misbehaves on `/v1/completions`.
// The gateway bounds an upstream's silence before its first event at 3 s here.
import type { IncomingMessage, ServerResponse } from "node:http";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
} from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { parseSse, withoutKeepalives } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { chunk, type FakeUpstream, startFakeUpstream } from "../upstream/fake-upstream.js";

const BOUND_MS = 3000;
/** A shorter bound, for requests sent one after another. */
const SHORT_BOUND_MS = 1500;
/** A caller's own bound on each request: far past the gateway's, short of the test's timeout. */
const CALLER_MS = 12_000;

type Misbehaviour = (req: IncomingMessage, res: ServerResponse, body: { stream?: boolean }) => void;

/** A replica that forwards the ops routes to `engine` and answers completions with `misbehave`. */
function fakeReplica(engine: RunningEngine, misbehave: Misbehaviour): Promise<FakeUpstream> {
  return startFakeUpstream(async (req, res, body) => {
    if (req.url === "/health" || req.url === "/v1/models" || req.url === "/tokenize") {
      const r = await fetch(`${engine.url}${req.url}`, {
        method: req.method ?? "GET",
        headers: { "content-type": "application/json" },
        ...(req.method === "POST" ? { body } : {}),
      });
      res.writeHead(r.status, { "content-type": r.headers.get("content-type") ?? "application/json" });
      res.end(Buffer.from(await r.arrayBuffer()));
      return;
    }
    misbehave(req, res, JSON.parse(body) as { stream?: boolean });
  });
}

/** Accepts a completion and never answers (nor closes). */
const silent: Misbehaviour = () => {};

/** Answers a stream's head and SSE comments every 300 ms, but never an event. */
const commentsOnly: Misbehaviour = (_req, res) => {
  res.writeHead(200, { "content-type": "text/event-stream" });
  const timer = setInterval(() => res.write(": ping\n\n"), 300);
  res.on("close", () => clearInterval(timer));
};

const piece = (text: string) => chunk(0, text, null, { token_ids: [7] });

/** Two chunks (a stream) or half a JSON body (unary), then the connection is reset. */
const resetAfterTwoChunks: Misbehaviour = (_req, res, body) => {
  if (body.stream === true) {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(`data: ${JSON.stringify(piece("«fake»"))}\n\ndata: ${JSON.stringify(piece("«fake»"))}\n\n`);
  } else {
    res.writeHead(200, { "content-type": "application/json" });
    res.write('{"id": "cmpl-x", "object": "text_completion", "choices": [');
  }
  setTimeout(() => res.socket?.destroy(), 50);
};

/** Two chunks (a stream), then SSE comments every 300 ms and no event: silent mid-answer, connection open. */
const silentAfterTwoChunks: Misbehaviour = (_req, res) => {
  res.writeHead(200, { "content-type": "text/event-stream" });
  res.write(`data: ${JSON.stringify(piece("«fake»"))}\n\ndata: ${JSON.stringify(piece("«fake»"))}\n\n`);
  const timer = setInterval(() => res.write(": ping\n\n"), 300);
  res.on("close", () => clearInterval(timer));
};

/** A whole answer (SSE or JSON, as asked), sent one byte a second. */
const drip: Misbehaviour = (_req, res, body) => {
  const text =
    body.stream === true
      ? `data: ${JSON.stringify(piece("«fake»"))}\n\ndata: [DONE]\n\n`
      : JSON.stringify({
          ...piece("«fake»"),
          usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
        });
  res.writeHead(200, { "content-type": body.stream === true ? "text/event-stream" : "application/json" });
  let i = 0;
  const timer = setInterval(() => {
    if (i < text.length) res.write(text[i++]);
    else res.end();
  }, 1000);
  res.on("close", () => clearInterval(timer));
};

const request = (prompt: string | number[], stream: boolean) => ({
  model: "tiny",
  prompt,
  max_tokens: 4,
  stream,
});

/** One REST completion: status and body, within {@link CALLER_MS}. */
async function rest(
  stack: Stack,
  prompt: string | number[],
  stream: boolean,
): Promise<{ status: number; text: string }> {
  const res = await fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(request(prompt, stream)),
    signal: AbortSignal.timeout(CALLER_MS),
  });
  return { status: res.status, text: await res.text() };
}

/** A REST stream that succeeded: 200, data events with no error, then [DONE]. */
function expectCompleteStream(r: { status: number; text: string }): void {
  expect(r.status).toBe(200);
  const blocks = withoutKeepalives(parseSse(r.text));
  expect(blocks.at(-1)).toEqual({ kind: "done" });
  const events = blocks.flatMap((b) => (b.kind === "data" ? [b.data as Record<string, unknown>] : []));
  expect(events.length).toBeGreaterThan(0);
  expect(events.filter((e) => "error" in e)).toEqual([]);
}

/** A metric's value from the gateway's /metrics (0 when absent). */
async function metric(stack: Stack, name: string, labels: string): Promise<number> {
  const text = await (await fetch(`${stack.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1));
}

/** The engine and the gateway, the faulty replica listed first. */
async function stackWith(
  engine: RunningEngine,
  faulty: FakeUpstream[],
  pool: { failureThreshold?: number } = {},
  boundMs = BOUND_MS,
): Promise<Stack> {
  return startStack({
    upstreams: [...faulty.map((f) => ({ url: f.url })), { url: engine.url }],
    model: { id: engine.model.id, servedModelName: engine.model.id, maxModelLen: engine.model.maxModelLen },
    upstreamHeadersTimeoutMs: boundMs,
    // Keepalives to the caller flow during the silence (they must not reset its bound).
    keepaliveIntervalMs: 400,
    nonStreamDeadlineMs: 10_000,
    // A replica taken out stays out for the test.
    pool: { backoff: { initialMs: 60_000 }, ...pool },
  });
}

/** The gateway with `faulty` as its model's only replica, kept up through its failures. */
function loneStack(engine: RunningEngine, faulty: FakeUpstream): Promise<Stack> {
  return startStack({
    upstreams: [{ url: faulty.url }],
    model: { id: engine.model.id, servedModelName: engine.model.id, maxModelLen: engine.model.maxModelLen },
    upstreamHeadersTimeoutMs: BOUND_MS,
    keepaliveIntervalMs: 400,
    pool: { failureThreshold: 100 },
  });
}

let engine: RunningEngine;
beforeAll(async () => {
  engine = await startEngine({ preset: "tiny" });
});
afterAll(async () => {
  await engine?.close();
});

describe("a silent replica listed first beside a good engine", () => {
  let replica: FakeUpstream;
  let stack: Stack;
  beforeAll(async () => {
    replica = await fakeReplica(engine, silent);
    stack = await stackWith(engine, [replica]);
  });
  afterAll(async () => {
    await stack?.close();
    await replica?.close();
  });

  it("8 of 8 unary and 8 of 8 streamed requests succeed; failovers counted; the replica taken out", async () => {
    const results = await Promise.all(
      // Token-id prompts: no /tokenize (text prompts, whose /tokenize the silent replica answers,
      // are the next case).
      Array.from({ length: 16 }, (_, i) => rest(stack, [1, 2, 3 + i], i % 2 === 1)),
    );
    for (const [i, r] of results.entries()) {
      if (i % 2 === 1) expectCompleteStream(r);
      else {
        expect(r.status).toBe(200);
        expect((JSON.parse(r.text) as { choices: unknown[] }).choices).toHaveLength(1);
      }
    }
    const sentToSilent = replica.requests.filter((q) => q.url === "/v1/completions").length;
    expect(sentToSilent).toBeGreaterThanOrEqual(3);
    const model = `model="${stack.modelId}"`;
    expect(await metric(stack, "acs_upstream_failovers_total", model)).toBe(sentToSilent);
    expect(await metric(stack, "acs_upstream_replica_up", `replica="${replica.url}"`)).toBe(0);
    expect(
      await metric(stack, "acs_upstream_replica_errors_total", `replica="${replica.url}",kind="silent"`),
    ).toBeGreaterThanOrEqual(3);
  });
});

describe("a silent replica listed first beside a good engine, text prompts one after another", () => {
  let replica: FakeUpstream;
  let stack: Stack;
  beforeAll(async () => {
    replica = await fakeReplica(engine, silent);
    stack = await stackWith(engine, [replica], {}, SHORT_BOUND_MS);
  });
  afterAll(async () => {
    await stack?.close();
    await replica?.close();
  });

  it("its /tokenize answers do not end its run of failed completions: taken out after 3, all succeed", async () => {
    // Each text prompt's /tokenize goes first and lands on the silent replica (it answers it:
    // fewest requests in flight, then first), between its failed completions.
    for (let i = 0; i < 6; i++) {
      const r = await rest(stack, `Hello ${i}`, i % 2 === 1);
      if (i % 2 === 1) expectCompleteStream(r);
      else {
        expect(r.status).toBe(200);
        expect((JSON.parse(r.text) as { choices: unknown[] }).choices).toHaveLength(1);
      }
    }
    const seen = (url: string) => replica.requests.filter((q) => q.url === url).length;
    expect(seen("/tokenize")).toBeGreaterThanOrEqual(3);
    expect(seen("/v1/completions")).toBe(3);
    const model = `model="${stack.modelId}"`;
    expect(await metric(stack, "acs_upstream_failovers_total", model)).toBe(3);
    expect(await metric(stack, "acs_upstream_replica_up", `replica="${replica.url}"`)).toBe(0);
    expect(
      await metric(stack, "acs_upstream_replica_errors_total", `replica="${replica.url}",kind="silent"`),
    ).toBe(3);
  });
});

describe("a single silent upstream: a stream ends with the error within the bound plus a second", () => {
  let replica: FakeUpstream;
  let stack: Stack;
  let h2: Http2SessionManager;
  const transports: Record<string, Transport> = {};
  beforeAll(async () => {
    replica = await fakeReplica(engine, commentsOnly);
    // Kept up through the four silences, so that each surface sees the in-band failure.
    stack = await loneStack(engine, replica);
    h2 = new Http2SessionManager(stack.url);
    transports.connect = createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" });
    transports.grpc = createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 });
    transports.grpcWeb = createGrpcWebTransport({ baseUrl: stack.url, httpVersion: "1.1" });
  });
  afterAll(async () => {
    h2?.abort();
    await stack?.close();
    await replica?.close();
  });

  /** A Connect-protocol family stream to its end: the code it failed with, and when. */
  async function rpcStream(transport: Transport): Promise<{ code: Code | undefined; ms: number }> {
    const started = Date.now();
    const client = createClient(CompletionsService, transport);
    const req = create(CreateCompletionRequestSchema, {
      model: "tiny",
      prompt: { case: "text", value: "Hello" },
      maxTokens: 4,
    });
    try {
      for await (const _ of client.streamCompletion(req, { signal: AbortSignal.timeout(CALLER_MS) })) {
        // no chunk is expected
      }
      return { code: undefined, ms: Date.now() - started };
    } catch (err) {
      return { code: ConnectError.from(err).code, ms: Date.now() - started };
    }
  }

  it("on REST SSE (in-band error event, then [DONE]), Connect, gRPC and gRPC-Web", async () => {
    const started = Date.now();
    const [sse, connect, grpc, grpcWeb] = await Promise.all([
      rest(stack, "Hello", true).then((r) => ({ ...r, ms: Date.now() - started })),
      rpcStream(transports.connect as Transport),
      rpcStream(transports.grpc as Transport),
      rpcStream(transports.grpcWeb as Transport),
    ]);
    expect(sse.status).toBe(200);
    const blocks = withoutKeepalives(parseSse(sse.text));
    expect(blocks.at(-1)).toEqual({ kind: "done" });
    const events = blocks.flatMap((b) => (b.kind === "data" ? [b.data as { error?: { code: string } }] : []));
    expect(events.map((e) => e.error?.code)).toEqual(["deadline_exceeded"]);
    expect(sse.ms).toBeLessThan(BOUND_MS + 1000);
    for (const r of [connect, grpc, grpcWeb]) {
      expect(r.code).toBe(Code.DeadlineExceeded);
      expect(r.ms).toBeLessThan(BOUND_MS + 1000);
    }
  });
});

describe.each([
  ["resets after two chunks", resetAfterTwoChunks],
  ["drips a byte a second", drip],
])("a replica that %s, listed first beside a good engine", (_, misbehave) => {
  let replica: FakeUpstream;
  let stack: Stack;
  beforeAll(async () => {
    replica = await fakeReplica(engine, misbehave);
    // Kept in through its failures, so that every request may land on it.
    stack = await stackWith(engine, [replica], { failureThreshold: 100 });
  });
  afterAll(async () => {
    await stack?.close();
    await replica?.close();
  });

  it("every unary request succeeds on the other", async () => {
    const results = await Promise.all(Array.from({ length: 4 }, (_, i) => rest(stack, `Hello ${i}`, false)));
    for (const r of results) {
      expect(r.status).toBe(200);
      const body = JSON.parse(r.text) as { choices: Array<{ text: string }> };
      expect(body.choices).toHaveLength(1);
      // Nothing of the faulty replica's: the collected chunks were dropped at the failover.
      expect(body.choices[0]?.text).not.toContain("«fake»");
    }
    expect(replica.requests.filter((q) => q.url === "/v1/completions").length).toBeGreaterThan(0);
  });
});

describe("a replica silent in the middle of its answer (two chunks, then nothing)", () => {
  let replica: FakeUpstream;
  let stack: Stack;
  afterEach(async () => {
    await stack?.close();
    await replica?.close();
  });

  it("beside a good engine: every unary request succeeds on the other, the silence counted", async () => {
    replica = await fakeReplica(engine, silentAfterTwoChunks);
    stack = await stackWith(engine, [replica], { failureThreshold: 100 });
    const results = await Promise.all(Array.from({ length: 4 }, (_, i) => rest(stack, `Hello ${i}`, false)));
    for (const r of results) {
      expect(r.status).toBe(200);
      expect((JSON.parse(r.text) as { choices: Array<{ text: string }> }).choices[0]?.text).not.toContain(
        "«fake»",
      );
    }
    expect(replica.requests.filter((q) => q.url === "/v1/completions").length).toBeGreaterThan(0);
    expect(
      await metric(stack, "acs_upstream_replica_errors_total", `replica="${replica.url}",kind="silent"`),
    ).toBeGreaterThan(0);
  });

  it("alone: a stream that sent chunks ends with the in-band 504 and [DONE] within the bound plus a second", async () => {
    replica = await fakeReplica(engine, silentAfterTwoChunks);
    stack = await loneStack(engine, replica);
    const started = Date.now();
    const r = await rest(stack, "Hello", true);
    const ms = Date.now() - started;
    expect(r.status).toBe(200);
    const blocks = withoutKeepalives(parseSse(r.text));
    expect(blocks.at(-1)).toEqual({ kind: "done" });
    const events = blocks.flatMap((b) =>
      b.kind === "data"
        ? [b.data as { error?: { code: string }; choices?: Array<{ text: string; finish_reason: unknown }> }]
        : [],
    );
    // The two chunks the caller got, then the error: never a normal finish.
    expect(events.filter((e) => e.choices !== undefined).map((e) => e.choices?.[0]?.text)).toEqual([
      "«fake»",
      "«fake»",
    ]);
    expect(events.flatMap((e) => e.choices ?? []).every((c) => c.finish_reason === null)).toBe(true);
    expect(events.at(-1)?.error?.code).toBe("deadline_exceeded");
    expect(ms).toBeGreaterThanOrEqual(BOUND_MS - 100);
    expect(ms).toBeLessThan(BOUND_MS + 1000);
  });
});
