// Drain and shutdown on real servers on loopback (src/surfaces/http/lifecycle.ts): a scripted Inference
// holds every completion until the test releases it, so that calls are in flight on every
// protocol (REST unary, SSE, Connect, gRPC, gRPC-Web) while the gateway drains and stops; an open
// grpc.health.v1.Health/Watch sees NOT_SERVING at once and ends when the listener stops. Keys on
// (SQLite): every Hold is settled once the gateway has closed.

import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { type AddressInfo, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
  Http2SessionManager,
} from "@connectrpc/connect-node";
import { pino } from "pino";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../gen/grpc/health/v1/health_pb.js";
import { createLifecycle, drainAndClose, type Lifecycle } from "../../src/app/index.js";
import { createBudgetLedger } from "../../src/budget/index.js";
import { createLogger } from "../../src/telemetry/index.js";
import { until } from "../helpers/hang-guard.js";
import { parseSse } from "../helpers/parse-sse.js";
import { type Stack, type StackOptions, startStack } from "../helpers/start-stack.js";
import { answerVllmOps } from "../upstream/fake-upstream.js";

const dir = mkdtempSync(join(tmpdir(), "acs-drain-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * Inference that streams "a", holds the completion until `release()`, then "b", usage, [DONE].
 * With `holdTokenize`, `/tokenize` is never answered: calls stay in their checks (`tokenizing`).
 */
function createHoldingUpstream(holdTokenize = false) {
  const waiting: (() => void)[] = [];
  let tokenizing = 0;
  const chunk = (text: string, finish: string | null) =>
    `data: ${JSON.stringify({
      id: "cmpl-x",
      object: "text_completion",
      created: 1,
      model: "acs/fake",
      choices: [{ index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null, token_ids: [1] }],
      usage: null,
    })}\n\n`;
  const usage = `data: ${JSON.stringify({
    id: "cmpl-x",
    object: "text_completion",
    created: 1,
    model: "acs/fake",
    choices: [],
    usage: { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4 },
  })}\n\n`;
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (answerVllmOps(req, res)) return;
      if (req.url === "/tokenize" && holdTokenize) {
        tokenizing++;
        res.once("close", () => tokenizing--);
        return;
      }
      if (req.url === "/tokenize") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ count: 2, max_model_len: 512, tokens: [1, 2] }));
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(chunk("a", null));
      const go = () => res.end(`${chunk("b", "length")}${usage}data: [DONE]\n\n`);
      waiting.push(go);
      res.once("close", () => {
        const i = waiting.indexOf(go);
        if (i >= 0) waiting.splice(i, 1);
      });
    });
  });
  return {
    server,
    /** Completions held now. */
    get held() {
      return waiting.length;
    },
    /** `/tokenize` requests held now (`holdTokenize`). */
    get tokenizing() {
      return tokenizing;
    },
    /** Lets every held completion finish. */
    release() {
      for (const go of waiting.splice(0)) go();
    },
  };
}

const stacks: Array<{
  stack: Stack;
  lifecycle: Lifecycle;
  upstream: ReturnType<typeof createHoldingUpstream>;
}> = [];
afterEach(async () => {
  for (const { stack, lifecycle, upstream } of stacks.splice(0)) {
    lifecycle.end();
    await stack.close().catch(() => {});
    upstream.server.closeAllConnections();
    await new Promise<void>((r) => upstream.server.close(() => r()));
  }
});

async function start(
  graceMs: number,
  options: {
    timeouts?: StackOptions["timeouts"];
    logger?: StackOptions["logger"];
    holdTokenize?: boolean;
  } = {},
) {
  const { timeouts, logger } = options;
  const upstream = createHoldingUpstream(options.holdTokenize);
  await new Promise<void>((r) => upstream.server.listen(0, "127.0.0.1", r));
  const port = (upstream.server.address() as AddressInfo).port;
  const dbPath = join(dir, `${graceMs}-${stacks.length}.db`);
  const lifecycle = createLifecycle({ graceMs });
  const stack = await startStack({
    upstreamUrl: `http://127.0.0.1:${port}`,
    dbPath,
    lifecycle,
    ...(timeouts ? { timeouts } : {}),
    ...(logger ? { logger } : {}),
  });
  stacks.push({ stack, lifecycle, upstream });
  const { id, key } = await stack.ledger!.createKey({ budgetTokens: 100_000, name: "drain" });
  return { stack, upstream, lifecycle, dbPath, keyId: id, key };
}

const request = (maxTokens = 8) =>
  create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: { case: "text", value: "hi" },
    maxTokens,
  });

/** The request id each call of {@link startCalls} sends (X-Request-Id), by call. */
const callIds = {
  restUnary: "call-rest-unary",
  sse: "call-sse",
  grpcStream: "call-grpc-stream",
  connectUnary: "call-connect-unary",
  grpcWebUnary: "call-grpc-web-unary",
} as const;

/** The calls in flight on every protocol, each resolving to how it ended. */
function startCalls(url: string, key: string, h2: Http2SessionManager) {
  const auth = { authorization: `Bearer ${key}` };
  const headers = { "content-type": "application/json", ...auth };
  const body = (stream: boolean) => JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 8, stream });
  const id = (call: keyof typeof callIds) => ({ ...auth, "x-request-id": callIds[call] });
  const restUnary = fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { ...headers, ...id("restUnary") },
    body: body(false),
  }).then(async (res) => ({ status: res.status, json: (await res.json()) as Record<string, unknown> }));
  const sseResponse = fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { ...headers, ...id("sse") },
    body: body(true),
  });
  const sse = sseResponse.then(async (res) => {
    const text = await res.text();
    // A refusal before the stream started is a JSON envelope with its status, not SSE.
    return { status: res.status, events: res.status === 200 ? parseSse(text) : [], text };
  });
  const grpc = createClient(CompletionsService, createGrpcTransport({ baseUrl: url, sessionManager: h2 }));
  const connectH1 = createClient(
    CompletionsService,
    createConnectTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat: false }),
  );
  const grpcWeb = createClient(
    CompletionsService,
    createGrpcWebTransport({ baseUrl: url, httpVersion: "1.1" }),
  );
  const settle = <T>(p: Promise<T>) =>
    p.then(
      (value) => ({ ok: true as const, value }),
      (e: unknown) => ({ ok: false as const, error: ConnectError.from(e) }),
    );
  const collect = async (it: AsyncIterable<{ choices: Array<{ text: string }> }>) => {
    let text = "";
    for await (const c of it) text += c.choices.map((x) => x.text).join("");
    return text;
  };
  return {
    restUnary,
    sse,
    /**
     * The SSE call's status line arrived: the gateway wrote it once it had Inference's first chunk,
     * which comes after Inference holds the call (`held`), so a test that needs the stream started
     * waits for this too.
     */
    sseStarted: sseResponse.then(() => undefined),
    grpcStream: settle(collect(grpc.streamCompletion(request(), { headers: id("grpcStream") }))),
    connectUnary: settle(connectH1.createCompletion(request(), { headers: id("connectUnary") })),
    grpcWebUnary: settle(grpcWeb.createCompletion(request(), { headers: id("grpcWebUnary") })),
  };
}
const CALLS = 5;

/** Watches the server's health over gRPC; `statuses` grows with each message; `end` is how it ended. */
function watchHealth(url: string, h2: Http2SessionManager) {
  const health = createClient(Health, createGrpcTransport({ baseUrl: url, sessionManager: h2 }));
  const statuses: Status[] = [];
  const end = (async () => {
    try {
      for await (const m of health.watch({ service: "" })) statuses.push(m.status);
      return { error: undefined };
    } catch (e) {
      return { error: ConnectError.from(e) };
    }
  })();
  return { statuses, end, health };
}

/** True when a new TCP connection to the port is refused. */
async function refused(url: string): Promise<boolean> {
  const { port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connect(Number(port), "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(false);
    });
    socket.once("error", () => resolve(true));
  });
}

async function openHolds(dbPath: string, keyId: string) {
  const ledger = await createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 });
  try {
    return await ledger.usage(keyId);
  } finally {
    await ledger.close();
  }
}

function envelopeOf(err: ConnectError) {
  const [detail] = err.findDetails(ErrorEnvelopeSchema);
  return detail;
}

describe("drain: not ready at once, still serving, then in-flight calls finish", () => {
  it("calls in flight on every protocol complete normally; Watch sees NOT_SERVING then ends; Holds settled", async () => {
    const { stack, upstream, lifecycle, dbPath, keyId, key } = await start(600_000, {
      timeouts: { keepAliveMs: 3_600_000 },
    });
    const h2 = new Http2SessionManager(stack.url);
    const watch = watchHealth(stack.url, h2);
    await until(() => watch.statuses.length === 1, "Watch sent the first status");
    expect(watch.statuses).toEqual([Status.SERVING]);

    const calls = startCalls(stack.url, key, h2);
    await until(() => upstream.held === CALLS, "every call is held at Inference");

    // Drain: readiness false at once; the listener still accepts, and new work is served.
    const closed = drainAndClose(stack.app, lifecycle, {
      drainDelayMs: 600_000,
      logger: pino({ level: "silent" }),
      signal: AbortSignal.abort(), // the test moves on itself (below)
    });
    // drainAndClose set `draining` synchronously; with the delay skipped it goes on to close.
    expect(lifecycle.phase).not.toBe("serving");
    await until(() => watch.statuses.length === 2, "Watch sent NOT_SERVING");
    expect(watch.statuses).toEqual([Status.SERVING, Status.NOT_SERVING]);

    // Stopping: no new connections; Watch ended with UNAVAILABLE; calls still held.
    await until(() => refused(stack.url), "the listener stopped accepting");
    const watched = await watch.end;
    expect(watched.error?.code).toBe(Code.Unavailable);
    expect(envelopeOf(watched.error!)?.error?.code).toBe("upstream_unavailable");
    expect(upstream.held).toBe(CALLS);
    expect(lifecycle.phase).toBe("stopping");

    upstream.release();
    const rest = await calls.restUnary;
    expect(rest.status).toBe(200);
    expect((rest.json.choices as Array<{ text: string }>)[0]?.text).toBe("ab");
    const sse = await calls.sse;
    expect(sse.status).toBe(200);
    expect(sse.events.at(-1)).toEqual({ kind: "done" });
    expect(JSON.stringify(sse.events)).not.toContain("upstream_unavailable");
    const grpcStream = await calls.grpcStream;
    expect(grpcStream).toEqual({ ok: true, value: "ab" });
    for (const unary of [await calls.connectUnary, await calls.grpcWebUnary]) {
      expect(unary.ok).toBe(true);
      if (unary.ok) expect(unary.value.choices[0]?.text).toBe("ab");
    }
    await closed;
    h2.abort();
    const usage = await openHolds(dbPath, keyId);
    expect(usage.openHolds).toBe(0);
    expect(usage.spentTokens).toBe(CALLS * 4);
  });

  it("during the drain delay /readyz is 503 and gRPC health NOT_SERVING, and new calls are served", async () => {
    const { stack, upstream, lifecycle, key } = await start(600_000);
    const skip = new AbortController();
    const closed = drainAndClose(stack.app, lifecycle, {
      drainDelayMs: 600_000,
      logger: pino({ level: "silent" }),
      signal: skip.signal,
    });
    expect(lifecycle.phase).toBe("draining");
    const ready = await fetch(`${stack.url}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { status: string }).status).toBe("not_ready");
    const h2 = new Http2SessionManager(stack.url);
    const health = createClient(Health, createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 }));
    expect((await health.check({ service: "" })).status).toBe(Status.NOT_SERVING);
    // A new connection and a new call, served as usual.
    const res = fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 8 }),
    });
    await until(() => upstream.held === 1, "the new call reached Inference");
    upstream.release();
    expect((await res).status).toBe(200);
    h2.abort();
    skip.abort();
    await closed;
  });
});

describe("past the grace: what is left ends with the in-band shutdown error", () => {
  it("REST 503 envelope, SSE error event + [DONE], Connect/gRPC/gRPC-Web UNAVAILABLE with the envelope; Holds settled", async () => {
    const { stack, upstream, lifecycle, dbPath, keyId, key } = await start(50);
    const h2 = new Http2SessionManager(stack.url);
    const calls = startCalls(stack.url, key, h2);
    await until(() => upstream.held === CALLS, "every call is held at Inference");
    await calls.sseStarted;
    // Inference never answers: the grace passes and the gateway ends every call itself.
    await drainAndClose(stack.app, lifecycle, { drainDelayMs: 0, logger: pino({ level: "silent" }) });
    expect(lifecycle.phase).toBe("ending");

    const rest = await calls.restUnary;
    expect(rest.status).toBe(503);
    expect(rest.json).toMatchObject({
      error: { code: "upstream_unavailable", message: "The server is shutting down; retry the request." },
    });
    const sse = await calls.sse;
    expect(sse.status).toBe(200);
    const data = sse.events.filter((e) => e.kind === "data").map((e) => e.data as Record<string, unknown>);
    expect(data.at(-1)).toMatchObject({ error: { code: "upstream_unavailable", type: "server_error" } });
    expect(sse.events.at(-1)).toEqual({ kind: "done" });
    for (const call of [await calls.grpcStream, await calls.connectUnary, await calls.grpcWebUnary]) {
      expect(call.ok).toBe(false);
      if (call.ok) continue;
      expect(call.error.code).toBe(Code.Unavailable);
      expect(envelopeOf(call.error)?.error?.code).toBe("upstream_unavailable");
    }
    h2.abort();
    const usage = await openHolds(dbPath, keyId);
    expect(usage.openHolds).toBe(0);
  });
});

describe("past the grace: the access log and the metrics", () => {
  it("record what each caller got (503 / unavailable with upstream_unavailable), not a caller's cancel", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = createLogger({
      level: "info",
      format: "json",
      destination: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) },
    });
    // ACS_SHUTDOWN_GRACE_MS=0: the calls in flight end as soon as the listener stops.
    const { stack, upstream, lifecycle, key } = await start(0, { logger });
    const h2 = new Http2SessionManager(stack.url);
    const calls = startCalls(stack.url, key, h2);
    await until(() => upstream.held === CALLS, "every call is held at Inference");
    await calls.sseStarted;
    await drainAndClose(stack.app, lifecycle, { drainDelayMs: 0, logger: pino({ level: "silent" }) });
    expect((await calls.restUnary).status).toBe(503);
    for (const call of [await calls.grpcStream, await calls.connectUnary, await calls.grpcWebUnary]) {
      expect(call.ok ? undefined : call.error.code).toBe(Code.Unavailable);
    }
    h2.abort();

    const lineOf = (id: string) => lines.find((l) => l.msg === "request" && l.requestId === id);
    await until(() => Object.values(callIds).every((id) => lineOf(id) !== undefined), "every access line");
    const shutDown = { level: 30, error: "upstream_unavailable" };
    expect(lineOf(callIds.restUnary)).toMatchObject({ ...shutDown, protocol: "rest", status: 503 });
    // The stream had started (200): the caller got the envelope as an SSE error event.
    expect(lineOf(callIds.sse)).toMatchObject({ ...shutDown, protocol: "rest", status: 200, stream: true });
    expect(lineOf(callIds.grpcStream)).toMatchObject({
      ...shutDown,
      protocol: "grpc",
      grpcCode: "unavailable",
    });
    expect(lineOf(callIds.connectUnary)).toMatchObject({
      ...shutDown,
      protocol: "connect",
      status: 503,
      grpcCode: "unavailable",
    });
    expect(lineOf(callIds.grpcWebUnary)).toMatchObject({
      ...shutDown,
      protocol: "grpc-web",
      grpcCode: "unavailable",
    });
    for (const id of Object.values(callIds)) expect(lineOf(id)).not.toHaveProperty("canceled");

    // acs_requests_total: the same outcomes, none counted as a cancel (499 / canceled).
    const counted = (await stack.metrics.getSingleMetric("acs_requests_total")?.get())?.values ?? [];
    const completions = counted.filter((v) => String(v.labels.route).includes("ompletion"));
    const sum = (pick: (labels: Record<string, unknown>) => boolean) =>
      completions.filter((v) => pick(v.labels)).reduce((n, v) => n + v.value, 0);
    expect(sum((l) => l.status === "499" || l.grpc_code === "canceled")).toBe(0);
    expect(sum((l) => l.protocol === "rest" && l.status === "503")).toBe(1);
    expect(sum((l) => l.protocol === "rest" && l.status === "200")).toBe(1);
    expect(sum((l) => l.grpc_code === "unavailable")).toBe(3);
  });
});

describe("past the grace: calls still in their checks", () => {
  it("fifteen calls on every protocol end with the shutdown error and print no MaxListenersExceededWarning", async () => {
    // More calls than an AbortSignal's 10 listeners: one listener per call on a shared signal
    // (the shutdown's, say) would print the warning.
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on("warning", onWarning);
    try {
      const { stack, upstream, lifecycle, dbPath, keyId, key } = await start(0, { holdTokenize: true });
      const h2 = new Http2SessionManager(stack.url);
      const rounds = [1, 2, 3].map(() => startCalls(stack.url, key, h2));
      const calls = rounds.length * CALLS;
      // Every call waits for Inference's count of its prompt: none has reached its Hold or Inference.
      await until(() => upstream.tokenizing === calls, "every call is in its prompt-length check");
      await drainAndClose(stack.app, lifecycle, { drainDelayMs: 0, logger: pino({ level: "silent" }) });
      for (const round of rounds) {
        const rest = await round.restUnary;
        expect(rest.status).toBe(503);
        expect(rest.json).toMatchObject({ error: { code: "upstream_unavailable" } });
        // Refused before its first chunk: a real status and the envelope, not an SSE event.
        const sse = await round.sse;
        expect(sse.status).toBe(503);
        expect(JSON.parse(sse.text)).toMatchObject({ error: { code: "upstream_unavailable" } });
        for (const call of [await round.grpcStream, await round.connectUnary, await round.grpcWebUnary]) {
          expect(call.ok ? undefined : call.error.code).toBe(Code.Unavailable);
        }
      }
      h2.abort();
      await until(() => upstream.tokenizing === 0, "every /tokenize request was aborted");
      expect(upstream.held).toBe(0);
      expect((await openHolds(dbPath, keyId)).openHolds).toBe(0);
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on next tick
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings.map((w) => `${w.name}: ${w.message}`)).toEqual([]);
  });
});

describe("stopping: a new request", () => {
  it("is refused with the 503 envelope and Connection: close, while the call in flight finishes", async () => {
    const { stack, upstream, lifecycle, key } = await start(600_000);
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const post = (body: string) =>
      new Promise<{ status: number; body: string; connection: string | undefined }>((resolve, reject) => {
        const req = http.request(
          `${stack.url}/v1/completions`,
          {
            method: "POST",
            agent,
            headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
          },
          (res) => {
            let text = "";
            res.setEncoding("utf8").on("data", (d: string) => {
              text += d;
            });
            res.on("end", () =>
              resolve({ status: res.statusCode ?? 0, body: text, connection: res.headers.connection }),
            );
          },
        );
        req.on("error", reject);
        req.end(body);
      });
    // One call in flight; then the gateway stops (phase only: the listener is the test's to close).
    const held = fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 8 }),
    });
    await until(() => upstream.held === 1, "the first call is held");
    lifecycle.stop();
    const refusedCall = await post(JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 8 }));
    expect(refusedCall.status).toBe(503);
    expect(JSON.parse(refusedCall.body)).toMatchObject({ error: { code: "upstream_unavailable" } });
    expect(refusedCall.connection).toBe("close");
    upstream.release();
    expect((await held).status).toBe(200);
    agent.destroy();
  });
});

describe("stopping: HTTP/1.1 keep-alive", () => {
  it("a connection whose call finishes during the grace is closed after its response, not held open", async () => {
    // Keep-alive connections would otherwise stay open for keepAliveMs, holding app.close().
    const { stack, upstream, key } = await start(600_000, { timeouts: { keepAliveMs: 3_600_000 } });
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const sockets: import("node:net").Socket[] = [];
    agent.on("free", (socket) => sockets.push(socket));
    const response = new Promise<number>((resolve, reject) => {
      const req = http.request(
        `${stack.url}/v1/completions`,
        {
          method: "POST",
          agent,
          headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        },
      );
      req.on("error", reject);
      req.end(JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 8 }));
    });
    await until(() => upstream.held === 1, "the call is held");
    const closed = stack.app.close();
    await until(() => refused(stack.url), "the listener stopped accepting");
    upstream.release();
    expect(await response).toBe(200);
    // Resolves only once every connection is closed: the kept-alive one too.
    await closed;
    await until(() => sockets.every((s) => s.destroyed), "the client saw its connection closed");
    agent.destroy();
  });
});
