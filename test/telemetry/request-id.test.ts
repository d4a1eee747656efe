// Request ids end to end: a valid incoming X-Request-Id is the request's id (response header,
// envelope, access log) and reaches Inference as its X-Request-Id; an invalid one is replaced; the
// caller's traceparent reaches Inference. The upstream is scripted and records what it was sent.
import type { IncomingMessage, ServerResponse } from "node:http";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import {
  claimUpstreamRequestId,
  liveUpstreamRequestIds,
  releaseUpstreamRequestId,
  upstreamRequestIdGroups,
} from "../../src/core/index.js";
import { requestIdFrom } from "../../src/telemetry/index.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import {
  answerCompletion,
  chunk,
  type FakeUpstream,
  startFakeUpstream,
  withVllmOps,
} from "../upstream/fake-upstream.js";

/** Inference: /tokenize (one token a character) and a completion of two tokens, streamed or not. */
function scripted(_req: IncomingMessage, res: ServerResponse, body: string): void {
  if (_req.url === "/tokenize") {
    const json = JSON.parse(body) as { prompt: string };
    const tokens = [...String(json.prompt)].map((_, i) => i + 1);
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ count: tokens.length, tokens, max_model_len: 512 }));
    return;
  }
  answerCompletion(res, body, [
    chunk(0, "a", null, { token_ids: [7] }),
    chunk(0, "b", "length", { token_ids: [8] }),
    {
      id: "cmpl-x",
      object: "text_completion",
      created: 1,
      model: "acs/fake",
      choices: [],
      usage: { prompt_tokens: 2, completion_tokens: 2, total_tokens: 4 },
    },
  ]);
}

let upstream: FakeUpstream;
let stack: Stack;

beforeAll(async () => {
  upstream = await startFakeUpstream(withVllmOps(scripted));
  stack = await startStack({ upstreamUrl: upstream.url });
});
afterAll(async () => {
  await stack.close();
  await upstream.close();
});

const completionsSeen = () => upstream.requests.filter((r) => r.url === "/v1/completions");

async function complete(headers: Record<string, string>, body: Record<string, unknown> = {}) {
  return fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: "acs/fake", prompt: "Hi", max_tokens: 2, ...body }),
  });
}

describe("X-Request-Id", () => {
  it("a valid incoming id is the response's id and Inference's X-Request-Id", async () => {
    const id = "3f2c9a1e-7b4d-4c5e-8f6a-0b1c2d3e4f5a";
    const before = completionsSeen().length;
    const res = await complete({ "x-request-id": id });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-request-id")).toBe(id);
    const seen = completionsSeen().slice(before);
    expect(seen.map((r) => r.headers["x-request-id"])).toEqual([id]);
  });

  it("is the envelope's request_id on a refusal, REST and Connect alike", async () => {
    const id = "order-42.retry:1";
    const res = await complete({ "x-request-id": id }, { max_tokens: -1 });
    expect(res.status).toBe(400);
    expect(res.headers.get("x-request-id")).toBe(id);
    expect(((await res.json()) as { request_id: string }).request_id).toBe(id);

    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const err = await client
      .listModels({}, { headers: { "x-request-id": id } })
      .then(() => undefined)
      .catch((e: unknown) => e);
    expect(err).toBeUndefined();
    let header: string | null = null;
    await client.listModels(
      {},
      {
        headers: { "x-request-id": id },
        onHeader: (h) => {
          header = h.get("x-request-id");
        },
      },
    );
    expect(header).toBe(id);
  });

  it.each([
    ["too long", "a".repeat(129)],
    ["a space", "two words"],
    ["a quote", 'x"y'],
    ["non-ASCII", "reqé"],
    ["two values", "a, b"],
  ])("an id with %s is replaced by a fresh one, also for Inference", async (_what, bad) => {
    const before = completionsSeen().length;
    const res = await complete({ "x-request-id": bad });
    expect(res.status).toBe(200);
    const id = res.headers.get("x-request-id");
    expect(id).toMatch(/^req_[0-9a-f]{32}$/);
    expect(
      completionsSeen()
        .slice(before)
        .map((r) => r.headers["x-request-id"]),
    ).toEqual([id]);

    // Connect too: the response's header.
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    let header: string | null = null;
    await client.listModels(
      {},
      {
        headers: { "x-request-id": bad },
        onHeader: (h) => {
          header = h.get("x-request-id");
        },
      },
    );
    expect(header).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("the longest accepted id (128 characters) is kept", async () => {
    const id = "A".repeat(128);
    const res = await complete({ "x-request-id": id });
    expect(res.headers.get("x-request-id")).toBe(id);
  });

  it("without one, the gateway's own id goes to Inference", async () => {
    const before = completionsSeen().length;
    const res = await complete({});
    const id = res.headers.get("x-request-id");
    expect(id).toMatch(/^req_[0-9a-f]{32}$/);
    expect(
      completionsSeen()
        .slice(before)
        .map((r) => r.headers["x-request-id"]),
    ).toEqual([id]);
  });
});

describe("traceparent", () => {
  it("the caller's traceparent and tracestate reach Inference (no spans recorded)", async () => {
    const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const before = completionsSeen().length;
    await complete({ traceparent, tracestate: "vendor=x" });
    const [seen] = completionsSeen().slice(before);
    expect(seen?.headers.traceparent).toBe(traceparent);
    expect(seen?.headers.tracestate).toBe("vendor=x");
  });

  it("without a traceparent, none is sent (no spans recorded)", async () => {
    const before = completionsSeen().length;
    await complete({});
    const [seen] = completionsSeen().slice(before);
    expect(seen?.headers.traceparent).toBeUndefined();
    expect(seen?.headers.tracestate).toBeUndefined();
  });

  it("an invalid traceparent is not passed on", async () => {
    const before = completionsSeen().length;
    await complete({ traceparent: "garbage" });
    const [seen] = completionsSeen().slice(before);
    expect(seen?.headers.traceparent).toBeUndefined();
  });
});

describe("ids of upstream requests", () => {
  it("an id already live is sent with a suffix; released ids are free again", () => {
    const before = liveUpstreamRequestIds();
    const a = claimUpstreamRequestId("job-1");
    const b = claimUpstreamRequestId("job-1");
    const c = claimUpstreamRequestId("job-1");
    expect([a, b, c]).toEqual(["job-1", "job-1-2", "job-1-3"]);
    releaseUpstreamRequestId(b);
    // Suffixes count up while one of them is open: job-1-3 still is.
    const d = claimUpstreamRequestId("job-1");
    expect(d).toBe("job-1-4");
    for (const id of [a, c, d]) releaseUpstreamRequestId(id);
    expect(liveUpstreamRequestIds()).toBe(before);
    expect(upstreamRequestIdGroups()).toBe(0);
    // Nothing of the burst is kept: the same id starts over.
    expect(claimUpstreamRequestId("job-1")).toBe("job-1");
    expect(claimUpstreamRequestId("job-1")).toBe("job-1-2");
    releaseUpstreamRequestId("job-1-2");
    releaseUpstreamRequestId("job-1");
    // Releasing twice, or an id never claimed, changes nothing.
    releaseUpstreamRequestId("job-1");
    releaseUpstreamRequestId("never-claimed");
    expect(liveUpstreamRequestIds()).toBe(before);
    expect(upstreamRequestIdGroups()).toBe(0);
  });

  it("a suffixed id a caller sent itself is skipped, never given twice", () => {
    const before = liveUpstreamRequestIds();
    const own = claimUpstreamRequestId("run-2"); // a caller's own X-Request-Id
    const a = claimUpstreamRequestId("run");
    const b = claimUpstreamRequestId("run");
    expect([own, a, b]).toEqual(["run-2", "run", "run-3"]);
    // The caller's run-2 ends; a new run-2 of that caller is run-2 again, not a suffix of run.
    releaseUpstreamRequestId(own);
    expect(claimUpstreamRequestId("run-2")).toBe("run-2");
    for (const id of ["run-2", a, b]) releaseUpstreamRequestId(id);
    expect(liveUpstreamRequestIds()).toBe(before);
    expect(upstreamRequestIdGroups()).toBe(0);
  });

  it("a burst of requests with one id gets distinct ids, and leaves nothing behind", () => {
    const before = liveUpstreamRequestIds();
    const ids = Array.from({ length: 20_000 }, () => claimUpstreamRequestId("burst"));
    expect(new Set(ids).size).toBe(20_000);
    expect(ids.slice(0, 3)).toEqual(["burst", "burst-2", "burst-3"]);
    for (const id of ids) releaseUpstreamRequestId(id);
    expect(liveUpstreamRequestIds()).toBe(before);
    expect(upstreamRequestIdGroups()).toBe(0);
  });

  it("two overlapping requests with one X-Request-Id reach Inference with different ids", async () => {
    const held: Array<() => void> = [];
    const slow = await startFakeUpstream(
      withVllmOps((req, res, body) => {
        if (req.url === "/tokenize") return scripted(req, res, body);
        // Both completions are answered only once both have arrived.
        held.push(() => scripted(req, res, body));
        if (held.length === 2) for (const go of held) go();
      }),
    );
    const slowStack = await startStack({ upstreamUrl: slow.url });
    try {
      const call = () =>
        fetch(`${slowStack.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-request-id": "same" },
          body: JSON.stringify({ model: "acs/fake", prompt: "Hi", max_tokens: 2 }),
        });
      const answers = await Promise.all([call(), call()]);
      expect(answers.map((r) => r.status)).toEqual([200, 200]);
      const ids = slow.requests
        .filter((r) => r.url === "/v1/completions")
        .map((r) => r.headers["x-request-id"]);
      expect(ids.sort()).toEqual(["same", "same-2"]);
      expect(liveUpstreamRequestIds()).toBe(0);
    } finally {
      await slowStack.close();
      await slow.close();
    }
  });

  it("requestIdFrom keeps the accepted form only", () => {
    expect(requestIdFrom("abc_DEF-1.2:3")).toBe("abc_DEF-1.2:3");
    expect(requestIdFrom(["a", "b"])).toMatch(/^req_/);
    expect(requestIdFrom("")).toMatch(/^req_/);
    expect(requestIdFrom(undefined)).toMatch(/^req_/);
  });
});
