// The replica pool over real Inference clients and scripted replicas on 127.0.0.1: choice,
// failover before output (never after), passive and active health, backoff and return.
import { create } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import {
  buildVllmRequest,
  createUpstreamPool,
  createVllmClient,
  type UpstreamPool,
  type UpstreamPoolOptions,
  type VllmClient,
  type VllmCompletionChunk,
} from "../../src/upstream/index.js";
import { configDefaults } from "../helpers/config-defaults.js";
import { until } from "../helpers/hang-guard.js";
import { chunk, closedPortUrl, type FakeUpstream, sse, startFakeUpstream } from "./fake-upstream.js";

/** The Inference clients' silence bound: the configuration's default (ACS_UPSTREAM_HEADERS_TIMEOUT_MS). */
const silenceTimeoutMs = configDefaults.upstreamHeadersTimeoutMs;

type Mode = "ok" | "503" | "500" | "400" | "401" | "cut-after-first" | "reset-before-first" | "hang";

/** A scripted replica: its completions behave as `mode`, its /health as `health`. */
interface Replica {
  readonly up: FakeUpstream;
  readonly name: string;
  mode: Mode;
  health: "ok" | "503" | "hang";
  /** How long its /health takes to answer, in ms. */
  healthDelayMs: number;
  served: string;
  /** X-Request-Id of each completion request it received. */
  readonly ids: string[];
}

const completionJson = (text: string) => ({
  id: "cmpl-x",
  object: "text_completion",
  created: 1,
  model: "served/model",
  choices: [{ index: 0, text, logprobs: null, finish_reason: "length", stop_reason: null }],
  usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
});

async function startReplica(name: string): Promise<Replica> {
  const r = {
    name,
    mode: "ok",
    health: "ok",
    healthDelayMs: 0,
    served: "served/model",
    ids: [] as string[],
  } as Omit<Replica, "up"> & { up?: FakeUpstream };
  r.up = await startFakeUpstream((req, res, raw) => {
    if (req.url === "/health") {
      if (r.health === "hang") return;
      const status = r.health === "ok" ? 200 : 503;
      setTimeout(() => {
        res.statusCode = status;
        res.end();
      }, r.healthDelayMs);
      return;
    }
    if (req.url === "/v1/models") {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ object: "list", data: [{ id: r.served, max_model_len: 512 }] }));
      return;
    }
    if (req.url === "/tokenize") {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ count: 3, max_model_len: 512, tokens: [1, 2, 3] }));
      return;
    }
    r.ids.push(String(req.headers["x-request-id"]));
    const stream = (JSON.parse(raw) as { stream?: boolean }).stream === true;
    switch (r.mode) {
      case "ok":
        if (stream) {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end(sse([chunk(0, name, "length")]));
        } else {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify(completionJson(name)));
        }
        return;
      case "503":
        res.writeHead(503, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "overloaded", type: "ServiceUnavailable", code: 503 } }));
        return;
      case "500":
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "boom", type: "InternalServerError", code: 500 } }));
        return;
      case "401":
        res.writeHead(401, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "Unauthorized", type: "Unauthorized", code: 401 } }));
        return;
      case "400":
        res.writeHead(400, { "content-type": "application/json" });
        res.end(
          JSON.stringify({ error: { message: "bad", type: "BadRequestError", param: "top_k", code: 400 } }),
        );
        return;
      case "cut-after-first":
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(sse([chunk(0, name)], false));
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      case "reset-before-first":
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.flushHeaders();
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      case "hang":
        return;
    }
  });
  return r as Replica;
}

const request = create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "text", value: "Hi" } });
const resolved = { servedModelName: "served/model", maxTokens: 4, vllmXargs: {} };
const streamBody = buildVllmRequest(request, { ...resolved, stream: true });
const unaryBody = buildVllmRequest(request, { ...resolved, stream: false });

let replicas: Replica[] = [];
let pool: UpstreamPool | undefined;
afterEach(async () => {
  await pool?.close();
  for (const r of replicas) await r.up.close();
  replicas = [];
  pool = undefined;
});

/** Log lines of the pool, as `level: message`. */
let logged: string[] = [];

async function setup(
  urls: Array<Replica | string>,
  opts: Partial<UpstreamPoolOptions> = {},
): Promise<UpstreamPool> {
  logged = [];
  pool = createUpstreamPool({
    model: "m",
    replicas: urls.map((u) => {
      const url = typeof u === "string" ? u : u.up.url;
      return { url, client: createVllmClient({ baseUrl: url, silenceTimeoutMs }) };
    }),
    admit: async (client: VllmClient, signal: AbortSignal) => {
      const list = await client.listModels(signal);
      if (!list.data.some((d) => d.id === "served/model")) {
        throw new Error(`it serves ${list.data.map((d) => d.id).join(", ")}, not served/model`);
      }
    },
    healthIntervalMs: 0,
    backoff: { initialMs: 50, maxMs: 200 },
    checkTimeoutMs: 300,
    logger: {
      info: (_o, msg) => logged.push(`info: ${msg}`),
      warn: (_o, msg) => logged.push(`warn: ${msg}`),
    },
    ...opts,
  });
  await pool.ready();
  return pool;
}

const signal = () => new AbortController().signal;

async function texts(p: UpstreamPool, id = "req-1"): Promise<string> {
  let text = "";
  for await (const c of p.stream(streamBody, { signal: signal(), upstreamRequestId: id })) {
    text += c.choices.map((x) => x.text).join("");
  }
  return text;
}

async function failure(promise: Promise<unknown>): Promise<ApiError> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!(err instanceof ApiError)) throw new Error(`expected an ApiError, got ${String(err)}`);
  return err;
}

const stateOf = (p: UpstreamPool) => p.replicas().map((r) => r.state);

describe("choice", () => {
  it("spreads sequential requests evenly over equal replicas, and by weight", async () => {
    replicas = await Promise.all(["a", "b", "c"].map(startReplica));
    const p = await setup(replicas);
    for (let i = 0; i < 30; i++) await texts(p, `even-${i}`);
    expect(replicas.map((r) => r.ids.length)).toEqual([10, 10, 10]);
    await pool?.close();

    for (const r of replicas) r.ids.length = 0;
    pool = createUpstreamPool({
      model: "m",
      replicas: replicas.map((r, i) => ({
        url: r.up.url,
        weight: i === 2 ? 2 : 1,
        client: createVllmClient({ baseUrl: r.up.url, silenceTimeoutMs }),
      })),
      healthIntervalMs: 0,
    });
    await pool.ready();
    for (let i = 0; i < 40; i++) await texts(pool, `weighted-${i}`);
    expect(replicas.map((r) => r.ids.length)).toEqual([10, 10, 20]);
  });

  it("control calls between completions do not steer the completions to one replica", async () => {
    // A text prompt's /tokenize goes before its completion: if both advanced the same clock, the
    // two would alternate replicas and every completion would land on the same one.
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const p = await setup(replicas);
    for (let i = 0; i < 10; i++) {
      await p.tokenize("served/model", `prompt ${i}`, true, signal());
      await texts(p, `mixed-${i}`);
    }
    expect(replicas.map((r) => r.ids.length)).toEqual([5, 5]);
  });

  it("sends a request to the replica with the fewest outstanding requests", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    a.mode = "hang";
    const p = await setup(replicas);
    const controller = new AbortController();
    // The first goes to a (tie: the first) and hangs there; the next three go to b, one at a time.
    const hung = p.complete(unaryBody, {
      signal: controller.signal,
      deadlineMs: 10_000,
      upstreamRequestId: "h",
    });
    await until(() => a.ids.length === 1, "the first request reached a");
    for (let i = 0; i < 3; i++) await texts(p, `next-${i}`);
    expect([a.ids.length, b.ids.length]).toEqual([1, 3]);
    expect(p.replicas().map((r) => r.outstanding)).toEqual([1, 0]);
    controller.abort();
    await failure(hung);
    expect(p.replicas().map((r) => r.outstanding)).toEqual([0, 0]);
  });
});

describe("failover before the first chunk", () => {
  it.each<[Mode, "unavailable" | "broken"]>([
    ["503", "unavailable"],
    ["reset-before-first", "broken"],
  ])("%s: the stream is sent once more, to the other replica, under a new request id", async (mode, kind) => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    a.mode = mode;
    const p = await setup(replicas);
    expect(await texts(p, "first-id")).toBe("b");
    expect(a.ids).toEqual(["first-id"]);
    expect(b.ids).toHaveLength(1);
    expect(b.ids[0]).not.toBe("first-id");
    expect(p.failovers()).toBe(1);
    expect(p.replicas()[0]?.errors[kind]).toBe(1);
  });

  it("a replica refused at start is down; requests go to the others", async () => {
    replicas = [await startReplica("b")];
    const p = await setup([await closedPortUrl(), replicas[0]!], { backoff: { initialMs: 60_000 } });
    expect(stateOf(p)).toEqual(["down", "up"]);
    expect(await texts(p)).toBe("b");
    expect(p.failovers()).toBe(0);
  });

  it("refused after it was up: taken out at once, the request served by the other", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    const p = await setup(replicas);
    expect(stateOf(p)).toEqual(["up", "up"]);
    await a.up.close(); // connection refused from now on
    const before = b.ids.length;
    expect(await texts(p)).toBe("b");
    expect(await texts(p)).toBe("b");
    expect(b.ids.length - before).toBe(2);
    expect(stateOf(p)).toEqual(["down", "up"]);
    // Refused, or a kept-alive connection found closed (then its check, refused, takes it out).
    const errors = p.replicas()[0]?.errors;
    expect((errors?.unreachable ?? 0) + (errors?.broken ?? 0)).toBe(1);
    expect(logged.some((l) => l.startsWith("warn: replica of m at") && l.includes("is down"))).toBe(true);
  });

  it("complete(): a 503 or a 500 is sent once more, once", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    const p = await setup(replicas);
    a.mode = "503";
    const ok = await p.complete(unaryBody, { signal: signal(), deadlineMs: 5000, upstreamRequestId: "u-1" });
    expect(ok.choices[0]?.text).toBe("b");
    expect([a.ids, b.ids.length]).toEqual([["u-1"], 1]);

    a.mode = "500";
    b.mode = "500";
    const err = await failure(
      p.complete(unaryBody, { signal: signal(), deadlineMs: 5000, upstreamRequestId: "u-2" }),
    );
    expect(err.code).toBe("upstream_error");
    expect(a.ids.length + b.ids.length).toBe(4); // two more requests in all: one failover, no more
  });

  it("a refusal of the request itself (400) is passed on, not sent again, and the replica stays up", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    for (const r of replicas) r.mode = "400";
    const p = await setup(replicas);
    const err = await failure(texts(p));
    expect([err.code, err.param]).toEqual(["invalid_request", "top_k"]);
    expect(replicas.reduce((n, r) => n + r.ids.length, 0)).toBe(1);
    expect(stateOf(p)).toEqual(["up", "up"]);
  });

  it("a single replica's failure before output is the caller's error (no other to try)", async () => {
    replicas = [await startReplica("a")];
    const p = await setup(replicas);
    replicas[0]!.mode = "503";
    const err = await failure(texts(p));
    expect(err.code).toBe("upstream_unavailable");
    expect(replicas[0]?.ids).toHaveLength(1);
  });
});

describe("never after the first chunk", () => {
  it("a stream cut after its first chunk fails; the other replica never sees it", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    a.mode = "cut-after-first";
    const p = await setup(replicas);
    const got: VllmCompletionChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const c of p.stream(streamBody, { signal: signal(), upstreamRequestId: "cut" }))
          got.push(c);
      })(),
    );
    expect(err.code).toBe("upstream_error");
    expect(got.map((c) => c.choices[0]?.text)).toEqual(["a"]);
    expect(b.ids).toEqual([]);
    expect(p.failovers()).toBe(0);
  });
});

describe("every replica down", () => {
  it("503 upstream_unavailable at once, nothing sent", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    for (const r of replicas) r.health = "503";
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    expect(stateOf(p)).toEqual(["down", "down"]);
    expect(p.serving()).toBe(false);
    expect(await p.health()).toBe(false);
    const err = await failure(texts(p));
    expect(err.code).toBe("upstream_unavailable");
    const err2 = await failure(p.tokenize("served/model", "Hi", true));
    expect(err2.code).toBe("upstream_unavailable");
    expect(replicas.every((r) => r.ids.length === 0)).toBe(true);
  });
});

describe("health", () => {
  it("takes out a replica whose /health fails, with backoff, and puts it back when it answers", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    const p = await setup(replicas, { healthIntervalMs: 30 });
    a.health = "503";
    await until(() => stateOf(p).join() === "down,up", "a was taken out");
    for (let i = 0; i < 4; i++) expect(await texts(p)).toBe("b");
    expect(a.ids).toEqual([]);
    const failedChecks = p.replicas()[0]?.errors.health ?? 0;
    // Checked again while down (backoff 50, 100, 200, 200 ms…), then put back.
    await until(() => (p.replicas()[0]?.errors.health ?? 0) > failedChecks, "a was checked again while down");
    a.health = "ok";
    await until(() => stateOf(p).join() === "up,up", "a was put back");
    expect(logged.some((l) => l === `info: replica of m at ${a.up.url} is up`)).toBe(true);
    const seen = a.ids.length;
    for (let i = 0; i < 4; i++) await texts(p);
    expect(a.ids.length - seen).toBe(2);
    expect(b.ids.length).toBe(6);
  });

  it("a replica that stops answering: taken out when its check times out, and requests waiting on it go to the other", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a] = replicas as [Replica, Replica];
    const p = await setup(replicas, { healthIntervalMs: 50, checkTimeoutMs: 200 });
    a.mode = "hang";
    a.health = "hang";
    const results = await Promise.all(Array.from({ length: 4 }, (_, i) => texts(p, `wait-${i}`)));
    expect(results).toEqual(["b", "b", "b", "b"]);
    expect(a.ids.length).toBeGreaterThan(0); // some waited on a, then went to b
    expect(p.failovers()).toBe(a.ids.length);
    expect(stateOf(p)).toEqual(["down", "up"]);
  });

  it("3 server errors in a row take a replica out; an answer in between resets the count", async () => {
    replicas = await Promise.all(["a"].map(startReplica));
    const [a] = replicas as [Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.mode = "500";
    await failure(texts(p));
    await failure(texts(p));
    a.mode = "400";
    await failure(texts(p));
    a.mode = "500";
    await failure(texts(p));
    await failure(texts(p));
    expect(stateOf(p)).toEqual(["up"]);
    await failure(texts(p));
    expect(stateOf(p)).toEqual(["down"]);
    expect(p.replicas()[0]?.errors.server_error).toBe(5);
  });

  it("its control calls' answers do not end a run of failed completions", async () => {
    replicas = await Promise.all(["a"].map(startReplica));
    const [a] = replicas as [Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    const tokenize = () => p.tokenize("served/model", "Hi", true, signal());
    a.mode = "500";
    await failure(texts(p));
    await tokenize();
    await failure(texts(p));
    await tokenize();
    await p.listModels(signal());
    expect(stateOf(p)).toEqual(["up"]);
    await failure(texts(p));
    expect(stateOf(p)).toEqual(["down"]);
  });

  it("panic mode: a lone replica taken out for failures in a row still serves, its own answers and errors", async () => {
    replicas = await Promise.all(["a"].map(startReplica));
    const [a] = replicas as [Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.mode = "500";
    for (let i = 0; i < 3; i++) await failure(texts(p));
    expect(stateOf(p)).toEqual(["down"]);
    const err = await failure(texts(p, "panic-500"));
    expect(err.code).toBe("upstream_error");
    a.mode = "ok";
    expect(await texts(p, "panic-ok")).toBe("a");
    expect(a.ids.slice(-2)).toEqual(["panic-500", "panic-ok"]);
    // A completion it answered puts it back (readiness and health follow), not its next check.
    expect(stateOf(p)).toEqual(["up"]);
  });

  it("panic mode: a failed attempt goes to another ejected replica", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a, b] = replicas as [Replica, Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.mode = "500";
    b.mode = "500";
    while (stateOf(p).includes("up")) await failure(texts(p));
    b.mode = "ok";
    for (let i = 0; i < 4; i++) expect(await texts(p, `after-${i}`)).toBe("b");
  });

  it("panic mode: an ejected replica that then refuses the gateway is no longer chosen", async () => {
    replicas = await Promise.all(["a"].map(startReplica));
    const [a] = replicas as [Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.mode = "500";
    for (let i = 0; i < 3; i++) await failure(texts(p));
    a.mode = "401";
    expect((await failure(texts(p))).code).not.toBe("upstream_unavailable"); // its own refusal, once
    const sent = a.ids.length;
    expect((await failure(texts(p))).code).toBe("upstream_unavailable");
    expect(a.ids.length).toBe(sent);
  });

  it("a check under way when a replica is taken out does not put it back", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a] = replicas as [Replica, Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    // Each 503 starts a check (one at a time); its /health answers 200 after the third took a out.
    a.mode = "503";
    a.healthDelayMs = 150; // within the check's 300 ms
    while (stateOf(p)[0] === "up") await texts(p);
    await new Promise((r) => setTimeout(r, 500));
    expect(stateOf(p)).toEqual(["down", "up"]);
  });

  it("panic mode: requests waiting on a lone replica are not aborted when it is taken out", async () => {
    replicas = await Promise.all(["a"].map(startReplica));
    const [a] = replicas as [Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.mode = "hang";
    const caller = new AbortController();
    let waiting: unknown = "pending";
    const stream = p.stream(streamBody, { signal: caller.signal, upstreamRequestId: "waiting" });
    const settled = stream[Symbol.asyncIterator]()
      .next()
      .then(
        (t) => (waiting = t),
        (e: unknown) => (waiting = e),
      );
    await until(() => a.ids.includes("waiting"), "the waiting request reached a");
    a.mode = "500";
    for (let i = 0; i < 3; i++) await failure(texts(p));
    expect(stateOf(p)).toEqual(["down"]);
    await new Promise((r) => setTimeout(r, 50));
    expect(waiting).toBe("pending");
    caller.abort();
    await settled;
  });

  it("panic mode is not used while another replica is up", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a] = replicas as [Replica, Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.mode = "500";
    while (stateOf(p)[0] === "up") await texts(p); // a's 500s go over to b
    const onA = a.ids.length;
    for (let i = 0; i < 4; i++) expect(await texts(p)).toBe("b");
    expect(a.ids.length).toBe(onA);
  });

  it("panic mode never chooses a replica whose check failed", async () => {
    replicas = await Promise.all(["a"].map(startReplica));
    const [a] = replicas as [Replica];
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    a.health = "503";
    a.mode = "reset-before-first";
    await failure(texts(p));
    await until(() => stateOf(p)[0] === "down", "a is taken out by its check");
    const sent = a.ids.length;
    a.mode = "ok";
    expect((await failure(texts(p))).code).toBe("upstream_unavailable");
    expect(a.ids.length).toBe(sent);
  });

  it("keeps out a replica that serves another model, and says what it serves", async () => {
    replicas = await Promise.all(["a", "b"].map(startReplica));
    const [a] = replicas as [Replica, Replica];
    a.served = "other/model";
    const p = await setup(replicas, { backoff: { initialMs: 60_000 } });
    expect(stateOf(p)).toEqual(["down", "up"]);
    expect(p.replicas()[0]?.reason).toBe("it serves other/model, not served/model");
    expect(logged).toContain(
      `warn: replica of m at ${a.up.url} is down: it serves other/model, not served/model`,
    );
  });
});
