import { getEventListeners } from "node:events";
import { create } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import {
  buildVllmRequest,
  createVllmClient,
  newUpstreamRequestId,
  upstreamFaultOf,
  type VllmClient,
  type VllmCompletionChunk,
} from "../../src/upstream/index.js";
import { configDefaults } from "../helpers/config-defaults.js";
import { HANG_GUARD_MS, until } from "../helpers/hang-guard.js";
import { chunk, closedPortUrl, type FakeUpstream, sse, startFakeUpstream } from "./fake-upstream.js";

/** The Inference clients' silence bound: the configuration's default (ACS_UPSTREAM_HEADERS_TIMEOUT_MS). */
const silenceTimeoutMs = configDefaults.upstreamHeadersTimeoutMs;

const req = create(CreateCompletionRequestSchema, {
  model: "llama-8b",
  prompt: { case: "text", value: "Hi" },
});
const resolved = { servedModelName: "served/model", maxTokens: 4, stream: false, vllmXargs: {} };
const body = buildVllmRequest(req, resolved);
const streamBody = buildVllmRequest(req, { ...resolved, stream: true });

const completion = {
  id: "cmpl-upstream",
  object: "text_completion",
  created: 1_700_000_000,
  model: "served/model",
  choices: [{ index: 0, text: " there", logprobs: null, finish_reason: "length", stop_reason: null }],
  usage: { prompt_tokens: 2, completion_tokens: 4, total_tokens: 6 },
};

let upstream: FakeUpstream | undefined;
let client: VllmClient | undefined;
afterEach(async () => {
  await client?.close();
  await upstream?.close();
  client = undefined;
  upstream = undefined;
});

async function setup(
  handler: Parameters<typeof startFakeUpstream>[0],
  opts: Partial<Parameters<typeof createVllmClient>[0]> = {},
): Promise<{ up: FakeUpstream; c: VllmClient }> {
  upstream = await startFakeUpstream(handler);
  client = createVllmClient({ baseUrl: upstream.url, silenceTimeoutMs, ...opts });
  return { up: upstream, c: client };
}

const call = (c: VllmClient, o: { signal?: AbortSignal; deadlineMs?: number } = {}) =>
  c.complete(body, {
    signal: o.signal ?? new AbortController().signal,
    deadlineMs: o.deadlineMs ?? HANG_GUARD_MS,
    upstreamRequestId: newUpstreamRequestId(),
  });

async function collect(it: AsyncIterable<VllmCompletionChunk>): Promise<VllmCompletionChunk[]> {
  const out: VllmCompletionChunk[] = [];
  for await (const c of it) out.push(c);
  return out;
}

const streamOf = (c: VllmClient, signal = new AbortController().signal) =>
  c.stream(streamBody, { signal, upstreamRequestId: newUpstreamRequestId() });

/** The ApiError a promise rejects with (fails the test if it resolves or throws something else). */
async function apiErrorOf(p: Promise<unknown>): Promise<ApiError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ApiError);
  return err as ApiError;
}

const json = (status: number, value: unknown) => (_req: unknown, res: import("node:http").ServerResponse) => {
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(value));
};

describe("complete", () => {
  it("posts the exact body with X-Request-Id and Authorization, and parses the completion", async () => {
    const { up, c } = await setup(json(200, completion), { apiKey: "sk-upstream" });
    const id = newUpstreamRequestId();
    const result = await c.complete(body, {
      signal: new AbortController().signal,
      deadlineMs: 5000,
      upstreamRequestId: id,
    });
    expect(result.choices[0]?.text).toBe(" there");
    expect(result.usage).toStrictEqual({ prompt_tokens: 2, completion_tokens: 4, total_tokens: 6 });
    const seen = up.requests[0];
    expect(seen?.method).toBe("POST");
    expect(seen?.url).toBe("/v1/completions");
    expect(seen?.headers["x-request-id"]).toBe(id);
    expect(seen?.headers.authorization).toBe("Bearer sk-upstream");
    expect(seen?.headers["content-type"]).toBe("application/json");
    expect(JSON.parse(seen?.body ?? "")).toStrictEqual(JSON.parse(JSON.stringify(body)));
  });

  it("sends a 64-bit seed exactly on the wire, and each call's own X-Request-Id", async () => {
    const { up, c } = await setup(json(200, completion));
    const seeded = buildVllmRequest(
      create(CreateCompletionRequestSchema, {
        model: "m",
        prompt: { case: "text", value: "x" },
        seed: -9223372036854775808n,
      }),
      resolved,
    );
    const ids = [newUpstreamRequestId(), newUpstreamRequestId(), newUpstreamRequestId()];
    await Promise.all(
      ids.map((upstreamRequestId) =>
        c.complete(seeded, { signal: new AbortController().signal, deadlineMs: 5000, upstreamRequestId }),
      ),
    );
    expect(up.requests.every((r) => r.body.includes('"seed":-9223372036854775808}'))).toBe(true);
    expect(new Set(up.requests.map((r) => r.headers["x-request-id"]))).toStrictEqual(new Set(ids));
  });

  it("keeps a base URL path prefix", async () => {
    upstream = await startFakeUpstream(json(200, completion));
    client = createVllmClient({ baseUrl: `${upstream.url}/inference/`, silenceTimeoutMs });
    await call(client);
    expect(upstream.requests[0]?.url).toBe("/inference/v1/completions");
  });

  it("refused connection → 503 upstream_unavailable", async () => {
    client = createVllmClient({ baseUrl: await closedPortUrl(), silenceTimeoutMs });
    const err = await apiErrorOf(call(client));
    expect(err.code).toBe("upstream_unavailable");
    expect(err.status).toBe(503);
  });

  it("connection reset before a response → 503 upstream_unavailable", async () => {
    const { c } = await setup((req) => req.socket.destroy());
    const err = await apiErrorOf(call(c));
    expect(err.code).toBe("upstream_unavailable");
  });

  it("500 → 502 upstream_error without Inference's internals", async () => {
    const { c } = await setup(
      json(500, {
        error: { message: "CUDA OOM in worker 3", type: "InternalServerError", param: null, code: 500 },
      }),
    );
    const err = await apiErrorOf(call(c));
    expect(err.code).toBe("upstream_error");
    expect(err.status).toBe(502);
    expect(err.message).not.toContain("CUDA");
  });

  it("an error body with status 200 is an error, not a completion", async () => {
    const { c } = await setup(
      json(200, {
        error: {
          message: "Token id 999999 is out of vocabulary",
          type: "BadRequestError",
          param: null,
          code: 400,
        },
      }),
    );
    const err = await apiErrorOf(call(c));
    expect(err.code).toBe("invalid_request");
    expect(err.message).toBe("Token id 999999 is out of vocabulary");
  });

  it("a 200 body that is not JSON, or not a completion → 502", async () => {
    const { c } = await setup((_req, res) => res.writeHead(200).end("<html>proxy</html>"));
    expect((await apiErrorOf(call(c))).code).toBe("upstream_error");
    await client?.close();
    await upstream?.close();
    const second = await setup(json(200, { choices: "nope" }));
    expect((await apiErrorOf(call(second.c))).code).toBe("upstream_error");
  });

  // The fake upstream below never answers and the client stays open during the test: only the
  // client's own abort closes the upstream response (its pool's timeouts are 300 s). A missing
  // abort leaves `closed` pending, which vitest's hang guard reports.
  it("slow upstream past the deadline → 504 deadline_exceeded and the upstream sees the abort", async () => {
    const { up, c } = await setup(() => {
      /* never answers */
    });
    const err = await apiErrorOf(call(c, { deadlineMs: 200 }));
    expect(err.code).toBe("deadline_exceeded");
    expect(err.status).toBe(504);
    const closed = await up.requests[0]?.closed;
    expect(closed?.aborted).toBe(true);
  });

  it("the deadline also covers a body that trickles in too slowly", async () => {
    const { up, c } = await setup((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write('{"id": "x", ');
    });
    const err = await apiErrorOf(call(c, { deadlineMs: 200 }));
    expect(err.code).toBe("deadline_exceeded");
    expect((await up.requests[0]?.closed)?.aborted).toBe(true);
  });

  it("headers timeout of the pool → 504", async () => {
    const { c } = await setup(() => {}, { headersTimeoutMs: 150 });
    const err = await apiErrorOf(call(c));
    expect(err.code).toBe("deadline_exceeded");
    expect(err.message).toMatch(/did not answer in time/); // the pool's timeout, not the call's deadline
  });

  it("caller abort → canceled, and the upstream sees the abort", async () => {
    const { up, c } = await setup(() => {});
    const ac = new AbortController();
    const p = call(c, { signal: ac.signal });
    await until(() => up.requests.length === 1, "the upstream got the request");
    ac.abort();
    expect((await apiErrorOf(p)).code).toBe("canceled");
    const closed = await up.requests[0]?.closed;
    expect(closed?.aborted).toBe(true);
  });

  it("an already aborted signal never reaches Inference", async () => {
    const { up, c } = await setup(json(200, completion));
    const ac = new AbortController();
    ac.abort();
    expect((await apiErrorOf(call(c, { signal: ac.signal }))).code).toBe("canceled");
    expect(up.requests).toHaveLength(0);
  });

  it("401 from Inference is the gateway's fault: 502, not the caller's", async () => {
    const { c } = await setup(json(401, { error: "Unauthorized" }));
    const err = await apiErrorOf(call(c));
    expect(err.code).toBe("upstream_error");
    expect(err.status).toBe(502);
  });

  it("reuses keep-alive connections", async () => {
    const ports = new Set<number>();
    const { c } = await setup((req, res) => {
      ports.add(req.socket.remotePort ?? 0);
      json(200, completion)(req, res);
    });
    for (let i = 0; i < 10; i++) await call(c);
    // Sequential calls reuse the pool's keep-alive sockets (undici may alternate between two).
    expect(ports.size).toBeLessThanOrEqual(2);
  });
});

describe("stream", () => {
  const sseHandler =
    (text: string, opts: { end?: boolean } = {}) =>
    (_req: unknown, res: import("node:http").ServerResponse) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(text);
      if (opts.end !== false) res.end();
    };

  it("yields the chunks until [DONE], usage chunk included", async () => {
    const usage = {
      ...chunk(0, ""),
      choices: [],
      usage: { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4 },
    };
    const { up, c } = await setup(sseHandler(sse([chunk(0, "a"), chunk(0, "b", "length"), usage])));
    const chunks = await collect(streamOf(c));
    expect(chunks.map((x) => x.choices[0]?.text ?? null)).toStrictEqual(["a", "b", null]);
    expect(chunks[1]?.choices[0]?.finish_reason).toBe("length");
    expect(chunks[2]?.usage?.total_tokens).toBe(4);
    expect(up.requests[0]?.headers.accept).toBe("text/event-stream");
    expect(JSON.parse(up.requests[0]?.body ?? "").stream_options).toStrictEqual({
      include_usage: true,
      continuous_usage_stats: false,
    });
  });

  describe("the silence bound (silenceTimeoutMs) holds between events too", () => {
    const BOUND = 300;

    it("events that keep coming keep it off, however long the stream", async () => {
      const { c } = await setup(
        (_req, res) => {
          res.writeHead(200, { "content-type": "text/event-stream" });
          let n = 0;
          const timer = setInterval(() => {
            if (++n <= 10) res.write(`data: ${JSON.stringify(chunk(0, `t${n}`))}\n\n`);
            else {
              clearInterval(timer);
              res.end("data: [DONE]\n\n");
            }
          }, 100);
        },
        { silenceTimeoutMs: BOUND },
      );
      expect((await collect(streamOf(c))).length).toBe(10);
    });

    it("a silence after chunks → 504 deadline_exceeded (fault silent) after them", async () => {
      const { c } = await setup(
        (_req, res) => {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.write(`data: ${JSON.stringify(chunk(0, "a"))}\n\ndata: ${JSON.stringify(chunk(0, "b"))}\n\n`);
          const timer = setInterval(() => res.write(": ping\n\n"), 50); // comments are not events
          res.on("close", () => clearInterval(timer));
        },
        { silenceTimeoutMs: BOUND },
      );
      const got: string[] = [];
      const started = Date.now();
      // The caller's own bound, far past the client's: without the bound the stream would wait.
      const err = await apiErrorOf(
        (async () => {
          for await (const x of streamOf(c, AbortSignal.timeout(10 * BOUND)))
            got.push(x.choices[0]?.text ?? "");
        })(),
      );
      expect(got).toEqual(["a", "b"]);
      expect(err.code).toBe("deadline_exceeded");
      expect(upstreamFaultOf(err)).toBe("silent");
      expect(Date.now() - started).toBeGreaterThanOrEqual(BOUND - 20);
    });

    it("a consumer that stops reading is not the upstream's silence", async () => {
      // 400 × 8 KiB: far more than the socket's buffers, so reading pauses while the queue is full.
      const big = Array.from({ length: 400 }, (_, i) => chunk(0, `${i}`.padEnd(8192, "x")));
      const { c } = await setup(sseHandler(sse(big)), {
        silenceTimeoutMs: BOUND,
      });
      const it = streamOf(c)[Symbol.asyncIterator]();
      const first = await it.next();
      expect(first.done).toBe(false);
      // Far past the bound while the queue is full and the socket paused.
      await new Promise((r) => setTimeout(r, 4 * BOUND));
      let n = 1;
      for (;;) {
        const step = await it.next();
        if (step.done === true) break;
        n++;
      }
      expect(n).toBe(400);
    });
  });

  it("in-band error then [DONE] → the mapped error after the chunks before it", async () => {
    const inBand = {
      error: {
        message:
          "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)",
        type: "BadRequestError",
        param: "logprobs",
        code: 400,
      },
    };
    const { c } = await setup(sseHandler(sse([chunk(0, "a"), inBand])));
    const seen: string[] = [];
    const err = await apiErrorOf(
      (async () => {
        for await (const x of streamOf(c)) seen.push(x.choices[0]?.text ?? "");
      })(),
    );
    expect(seen).toStrictEqual(["a"]);
    expect(err.code).toBe("invalid_request");
    expect(err.param).toBe("logprobs");
    expect(err.message).toBe("Requested sample logprobs of 21, which is greater than max allowed: 20");
  });

  it("stream that ends without [DONE] → 502", async () => {
    const { c } = await setup(sseHandler(sse([chunk(0, "a")], false)));
    expect((await apiErrorOf(collect(streamOf(c)))).code).toBe("upstream_error");
  });

  it("reset mid-stream → 502", async () => {
    const { c } = await setup((req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(sse([chunk(0, "a")], false));
      setTimeout(() => req.socket.destroy(), 50);
    });
    const err = await apiErrorOf(collect(streamOf(c)));
    expect(err.code).toBe("upstream_error");
    expect(err.status).toBe(502);
  });

  it.each([
    ["not JSON", "data: {not json\n\ndata: [DONE]\n\n"],
    ["not SSE", "hello there\n\ndata: [DONE]\n\n"],
    ["not a chunk", 'data: {"choices": [{"index": "zero"}]}\n\ndata: [DONE]\n\n'],
    ["an event type", "event: ping\ndata: {}\n\ndata: [DONE]\n\n"],
  ])("garbage SSE (%s) → 502", async (_, text) => {
    const { c } = await setup(sseHandler(text));
    expect((await apiErrorOf(collect(streamOf(c)))).code).toBe("upstream_error");
  });

  it("500 before the stream → 502; error body with status 200 and JSON content type → mapped", async () => {
    const { c } = await setup(
      json(500, { object: "error", message: "boom", type: "InternalServerError", param: null, code: 500 }),
    );
    expect((await apiErrorOf(collect(streamOf(c)))).code).toBe("upstream_error");
    await client?.close();
    await upstream?.close();
    const second = await setup(
      json(200, { object: "error", message: "bad", type: "BadRequestError", param: "n", code: 400 }),
    );
    const err = await apiErrorOf(collect(streamOf(second.c)));
    expect([err.code, err.param, err.message]).toStrictEqual(["invalid_request", "n", "bad"]);
  });

  it("refused connection → 503", async () => {
    client = createVllmClient({ baseUrl: await closedPortUrl(), silenceTimeoutMs });
    expect((await apiErrorOf(collect(streamOf(client)))).code).toBe("upstream_unavailable");
  });

  it("an already aborted signal: canceled without reaching Inference, then the stream is over", async () => {
    const { up, c } = await setup(sseHandler(sse([chunk(0, "a")])));
    const caller = new AbortController();
    caller.abort();
    const it = streamOf(c, caller.signal)[Symbol.asyncIterator]();
    expect((await apiErrorOf(it.next())).code).toBe("canceled");
    expect(await it.next()).toStrictEqual({ value: undefined, done: true });
    expect(up.requests).toHaveLength(0);
  });

  it("consumer stops early → the upstream sees the connection close", async () => {
    const { up, c } = await setup((_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      let i = 0;
      const timer = setInterval(() => res.write(sse([chunk(0, `t${i++}`)], false)), 20);
      res.on("close", () => clearInterval(timer));
    });
    let n = 0;
    for await (const _ of streamOf(c)) {
      if (++n === 3) break;
    }
    // the fake streams forever: only the client's abort ends its response
    const closed = await up.requests[0]?.closed;
    expect(closed?.aborted).toBe(true);
  });

  it("caller abort mid-stream → canceled, upstream closed", async () => {
    const { up, c } = await setup((_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(sse([chunk(0, "first")], false));
    });
    const ac = new AbortController();
    const it = streamOf(c, ac.signal)[Symbol.asyncIterator]();
    expect((await it.next()).value?.choices[0]?.text).toBe("first");
    const pending = it.next();
    ac.abort();
    expect((await apiErrorOf(pending)).code).toBe("canceled");
    const closed = await up.requests[0]?.closed;
    expect(closed?.aborted).toBe(true);
  });
});

describe("tokenize, models, health", () => {
  it("tokenize posts {model, prompt, add_special_tokens} and caches by all three", async () => {
    const { up, c } = await setup((_req, res, b) => {
      const { prompt, add_special_tokens } = JSON.parse(b) as { prompt: string; add_special_tokens: boolean };
      const tokens = [...prompt].map((ch) => ch.codePointAt(0) ?? 0);
      if (add_special_tokens) tokens.unshift(1);
      json(200, { count: tokens.length, max_model_len: 8192, tokens })(_req, res);
    });
    const a = await c.tokenize("served/model", "héllo", true);
    expect(a).toStrictEqual({ count: 6, tokens: [1, 104, 233, 108, 108, 111], maxModelLen: 8192 });
    a.tokens.push(42); // a caller's mutation must not reach the cache
    expect(await c.tokenize("served/model", "héllo", true)).toStrictEqual({
      count: 6,
      tokens: [1, 104, 233, 108, 108, 111],
      maxModelLen: 8192,
    });
    expect(up.requests).toHaveLength(1);
    await c.tokenize("served/model", "héllo", false);
    await c.tokenize("other/model", "héllo", true);
    expect(up.requests).toHaveLength(3);
    expect(JSON.parse(up.requests[0]?.body ?? "")).toStrictEqual({
      model: "served/model",
      prompt: "héllo",
      add_special_tokens: true,
    });
    expect(up.requests[0]?.url).toBe("/tokenize");
    const ids = new Set(up.requests.map((r) => r.headers["x-request-id"]));
    expect(ids.size).toBe(3);
  });

  it("twelve calls under one signal: one abort listener on it, and one abort cancels them all", async () => {
    const { up, c } = await setup(() => {}); // never answers
    const ac = new AbortController();
    const calls = Array.from({ length: 12 }, (_, i) => apiErrorOf(c.tokenize("m", `p${i}`, true, ac.signal)));
    await until(() => up.requests.length === 12, "Inference received the twelve calls");
    // one per signal, not one per call (11 would print MaxListenersExceededWarning)
    expect(getEventListeners(ac.signal, "abort")).toHaveLength(1);
    ac.abort();
    expect((await Promise.all(calls)).map((e) => e.code)).toEqual(Array(12).fill("canceled"));
    const closed = await Promise.all(up.requests.map((r) => r.closed));
    expect(closed.every((x) => x.aborted)).toBe(true);
  });

  it("calls that end remove their abort listener from the caller's signal", async () => {
    const { c } = await setup(json(200, { count: 1, max_model_len: 8192, tokens: [1] }));
    const ac = new AbortController();
    await Promise.all(Array.from({ length: 12 }, (_, i) => c.tokenize("m", `q${i}`, true, ac.signal)));
    expect(getEventListeners(ac.signal, "abort")).toHaveLength(0);
  });

  it("tokenize errors are mapped (404 model → model_not_found)", async () => {
    const { c } = await setup(
      json(404, {
        error: { message: "The model `x` does not exist.", type: "NotFoundError", param: "model", code: 404 },
      }),
    );
    const err = await apiErrorOf(c.tokenize("x", "hi", true));
    expect([err.code, err.param]).toStrictEqual(["model_not_found", "model"]);
  });

  it("listModels parses GET /v1/models", async () => {
    const { up, c } = await setup(
      json(200, {
        object: "list",
        data: [
          {
            id: "served/model",
            object: "model",
            created: 1,
            owned_by: "vllm",
            root: "r",
            parent: null,
            max_model_len: 8192,
          },
        ],
      }),
    );
    const list = await c.listModels();
    expect(list.data[0]).toMatchObject({ id: "served/model", max_model_len: 8192, parent: null });
    expect(up.requests[0]?.method).toBe("GET");
    expect(up.requests[0]?.url).toBe("/v1/models");
  });

  it("health is true on 200, false on 503 and on a refused connection", async () => {
    let status = 200;
    const { c } = await setup((_req, res) => res.writeHead(status).end());
    expect(await c.health()).toBe(true);
    status = 503;
    expect(await c.health()).toBe(false);
    const dead = createVllmClient({ baseUrl: await closedPortUrl(), silenceTimeoutMs });
    try {
      expect(await dead.health()).toBe(false);
    } finally {
      await dead.close();
    }
  });
});

describe("connections", () => {
  it("reuses one connection for serial streams whose [DONE] and chunked end come in two writes (uvicorn)", async () => {
    const { up, c } = await setup((_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(sse([chunk(0, "a", "length")], false));
      res.write("data: [DONE]\n\n");
      // the chunked terminator as a write of its own, a moment later, as uvicorn does
      setTimeout(() => res.end(), 10);
    });
    for (let i = 0; i < 20; i++) expect(await collect(streamOf(c))).toHaveLength(1);
    expect(up.requests).toHaveLength(20);
    // Reused: a few at most (undici may dispatch the next request a moment before the socket is
    // back in the pool), where a body destroyed at [DONE] costs one connection per stream (20).
    expect(up.connections).toBeLessThanOrEqual(3);
  });

  it("a slow consumer of many chunks in one write gets them all, in order, and the connection back", async () => {
    // 200 events in one write: more than the client queues before it stops reading the socket.
    const many = Array.from({ length: 200 }, (_, i) => chunk(0, `t${i}`, i === 199 ? "length" : null));
    const { up, c } = await setup((_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" }).end(sse(many));
    });
    for (let round = 0; round < 2; round++) {
      const texts: string[] = [];
      for await (const x of streamOf(c)) {
        texts.push(x.choices[0]?.text ?? "");
        await new Promise((resolve) => setImmediate(resolve));
      }
      expect(texts).toStrictEqual(many.map((_, i) => `t${i}`));
    }
    expect(up.connections).toBe(1);
  });

  it("a consumer that stops taking chunks stops the socket's reads: Inference's writes back up, then all arrive", async () => {
    // 100,000 events (~30 MB), written as fast as the socket takes them. Without the pause the
    // client would read (and queue) all of them while its consumer takes none.
    const total = 100_000;
    const state = { written: 0, waiting: false, finished: false };
    const { c } = await setup(async (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (let i = 0; i < total; i += 1000) {
        const batch = Array.from({ length: 1000 }, (_, k) => chunk(0, `t${i + k}`));
        const text = sse(batch, false);
        state.written += text.length;
        if (!res.write(text)) {
          state.waiting = true;
          await new Promise((resolve) => res.once("drain", resolve));
          state.waiting = false;
        }
      }
      res.end(sse([chunk(0, "end", "length")]));
      state.finished = true;
    });
    const it = streamOf(c)[Symbol.asyncIterator]();
    expect((await it.next()).value?.choices[0]?.text).toBe("t0");
    // The consumer takes nothing more: Inference is soon stuck on a full socket (nothing written
    // over 20 polls in a row, long before the 30 MB are out).
    let still = 0;
    let last = -1;
    await until(() => {
      still = state.waiting && state.written === last ? still + 1 : 0;
      last = state.written;
      return still >= 20 || state.finished;
    }, "Inference's writes stopped or ended");
    expect(state.finished).toBe(false);
    // Taking the chunks resumes the reads: every one arrives, in order.
    let n = 1;
    for (let next = await it.next(); next.done !== true; next = await it.next()) {
      const text = next.value.choices[0]?.text;
      if (n < total) expect(text).toBe(`t${n}`);
      else expect(text).toBe("end");
      n++;
    }
    expect(n).toBe(total + 1);
    expect(state.finished).toBe(true);
  });

  it("a caller that leaves while the end after [DONE] is still awaited ends the stream normally", async () => {
    const caller = new AbortController();
    let ended = false;
    const { c } = await setup((_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(sse([chunk(0, "a", "length")]));
      // the chunked terminator never comes
      res.on("close", () => {
        ended = true;
      });
    });
    const it = streamOf(c, caller.signal)[Symbol.asyncIterator]();
    expect((await it.next()).done).toBe(false);
    const last = it.next();
    caller.abort();
    expect((await last).done).toBe(true);
    await until(() => ended, "the upstream connection was closed");
  });

  it("answers /tokenize while every completion connection is held by a stream", async () => {
    const held: Array<() => void> = [];
    const { up, c } = await setup(
      (req, res) => {
        if (req.url === "/tokenize") {
          res.setHeader("content-type", "application/json");
          res.end(JSON.stringify({ count: 2, max_model_len: 512, tokens: [1, 2] }));
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(sse([chunk(0, "a")], false));
        held.push(() => res.end(sse([chunk(0, "b", "length")])));
      },
      { connections: 2 },
    );
    const streams = [collect(streamOf(c)), collect(streamOf(c))];
    await until(() => held.length === 2, "both completion connections are busy");
    expect((await c.tokenize("m", "Hi", true)).count).toBe(2);
    for (const release of held) release();
    expect((await Promise.all(streams)).map((s) => s.length)).toEqual([2, 2]);
    expect(up.requests.filter((r) => r.url === "/tokenize")).toHaveLength(1);
  });

  it("gives a /tokenize that Inference never answers 504 deadline_exceeded at the control deadline", async () => {
    // 500 ms, not less: on a loaded machine a shorter deadline fired before the request reached
    // the silent server (the full suite saw `requests[0]` undefined at 50 ms).
    const { up, c } = await setup(() => {}, { controlDeadlineMs: 500 });
    const err = await apiErrorOf(c.tokenize("m", "Hi", true));
    expect(err.code).toBe("deadline_exceeded");
    expect((await up.requests[0]?.closed)?.aborted).toBe(true);
  });
});
