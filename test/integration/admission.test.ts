// Per-key caps on requests in flight (proto/API.md §9): the request past a cap is refused with 429
// `rate_limited` naming the cap, on every surface, with Retry-After; its key's other requests and
// other keys are not affected; the place is given back on every end path (no leak: afterwards
// the cap's worth of requests is admitted again). And one key's share of a model's capacity.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { decodeError, type ErrorForm, exchange, frame, type WireRequest } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { type FakeUpstream, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

/**
 * Inference: a token per character. The prompt "hold" is never answered (until the gateway goes
 * away), "fail" gets a 500, any other prompt one token "ok". `held()`: "hold" requests open now.
 */
async function scriptedInference(): Promise<FakeUpstream & { held(): number }> {
  let open = 0;
  const upstream = await startFakeUpstream(
    withVllmOps((req, res, body) => {
      const json = JSON.parse(body) as { prompt: string };
      if (req.url === "/tokenize") {
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify({
            count: json.prompt.length,
            max_model_len: 512,
            tokens: [...json.prompt].map(() => 1),
          }),
        );
        return;
      }
      if (json.prompt === "hold") {
        open++;
        res.on("close", () => open--);
        return;
      }
      if (json.prompt === "fail") {
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ object: "error", message: "boom", type: "InternalServerError", code: 500 }));
        return;
      }
      const event = (choices: unknown[], usage: unknown) =>
        `data: ${JSON.stringify({ id: "cmpl-x", object: "text_completion", created: 1, model: "acs/fake", choices, usage })}\n\n`;
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(
        event(
          [
            {
              index: 0,
              text: "ok",
              logprobs: null,
              finish_reason: "length",
              stop_reason: null,
              token_ids: [1],
            },
          ],
          null,
        ) +
          event([], {
            prompt_tokens: json.prompt.length,
            completion_tokens: 1,
            total_tokens: json.prompt.length + 1,
          }) +
          "data: [DONE]\n\n",
      );
    }),
  );
  return Object.assign(upstream, { held: () => open });
}

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "acs-admission-"));
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

/** A request that Inference holds, sent over `surface`, aborted by `stop`. */
function hold(stack: Stack, key: string, surface: "rest" | "rest-stream" | "connect", stop: AbortSignal) {
  const auth = { authorization: `Bearer ${key}` };
  const sent =
    surface === "connect"
      ? fetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
          method: "POST",
          headers: { "content-type": "application/json", ...auth },
          body: JSON.stringify({ model: "tiny", text: "hold", maxTokens: 5 }),
          signal: stop,
        })
      : fetch(`${stack.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", ...auth },
          body: JSON.stringify({
            model: "tiny",
            prompt: "hold",
            max_tokens: 5,
            stream: surface === "rest-stream",
          }),
          signal: stop,
        });
  return sent.then(
    async (res) => {
      await res.body?.cancel().catch(() => {});
      return res.status;
    },
    () => "aborted" as const,
  );
}

/** A request on each RPC surface (JSON where there is a choice). */
function rpcRequests(key: string, text = "Hi", stream = false): [ErrorForm, WireRequest][] {
  const json = new TextEncoder().encode(JSON.stringify({ model: "tiny", text, maxTokens: 5 }));
  const auth = { authorization: `Bearer ${key}` };
  const unary = "/acs.v1.CompletionsService/CreateCompletion";
  const streamed = "/acs.v1.CompletionsService/StreamCompletion";
  const path = stream ? streamed : unary;
  const all: [ErrorForm, WireRequest][] = [
    [
      "connect-stream",
      { path: streamed, headers: { "content-type": "application/connect+json", ...auth }, body: frame(json) },
    ],
    [
      "grpc",
      { http2: true, path, headers: { "content-type": "application/grpc+json", ...auth }, body: frame(json) },
    ],
    [
      "grpc-web",
      { path, headers: { "content-type": "application/grpc-web+json", ...auth }, body: frame(json) },
    ],
  ];
  if (!stream)
    all.unshift([
      "connect",
      { path: unary, headers: { "content-type": "application/json", ...auth }, body: json },
    ]);
  return all;
}

async function restRefusal(stack: Stack, key: string, stream: boolean) {
  const res = await exchange(stack.url, {
    path: "/v1/completions",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 5, stream }),
  });
  return decodeError("rest", res);
}

const sdk = (stack: Stack, key: string) =>
  new OpenAI({ apiKey: key, baseURL: `${stack.url}/v1`, maxRetries: 0 });

describe("per-key caps on requests and streams in flight", () => {
  let upstream: Awaited<ReturnType<typeof scriptedInference>>;
  let stack: Stack;
  beforeAll(async () => {
    upstream = await scriptedInference();
    stack = await startStack({
      upstreamUrl: upstream.url,
      dbPath: join(dir, "caps.db"),
      maxRequestsPerKey: 3,
      maxStreamsPerKey: 2,
      maxUpstreamSharePerKey: 1,
    });
  });
  afterAll(async () => {
    await stack.close();
    await upstream.close();
  });
  const ledger = () => {
    if (stack.ledger === undefined) throw new Error("no ledger");
    return stack.ledger;
  };

  it("cap + 1 concurrent requests: exactly the extra one is refused, on REST and every RPC surface; released after", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 100_000 });
    const other = await ledger().createKey({ budgetTokens: 100_000 });
    const stop = new AbortController();
    const held = [
      hold(stack, key, "rest", stop.signal),
      hold(stack, key, "rest-stream", stop.signal),
      hold(stack, key, "connect", stop.signal),
    ];
    await until(() => upstream.held() === 3, "three requests held by Inference");
    expect(stack.admission.inFlight(id).requests).toBe(3);

    const message =
      "This key already has 3 requests in flight: the per-key request cap is 3 concurrent requests (streamed or not). Retry when one of them has finished.";
    for (const stream of [false, true]) {
      const rest = await restRefusal(stack, key, stream);
      expect(rest.httpStatus).toBe(429);
      expect(rest.envelope).toMatchObject({
        type: "rate_limit_error",
        code: "rate_limited",
        param: null,
        message,
      });
      expect(rest.envelope.requestId).toBe(rest.requestIdHeader);
      expect(rest.metadata.get("retry-after")).toBe("1");
      expect(rest.metadata.get("x-should-retry")).toBe("true");
    }
    const sdkErr = await sdk(stack, key)
      .completions.create({ model: "tiny", prompt: "Hi", max_tokens: 5 })
      .then(
        () => undefined,
        (err: unknown) => err,
      );
    expect(sdkErr).toBeInstanceOf(OpenAI.RateLimitError);
    expect((sdkErr as InstanceType<typeof OpenAI.APIError>).code).toBe("rate_limited");
    for (const [form, req] of rpcRequests(key)) {
      const error = decodeError(form, await exchange(stack.url, req));
      expect(error.envelope, form).toMatchObject({ type: "rate_limit_error", code: "rate_limited", message });
      expect(error.metadata.get("retry-after"), form).toBe("1");
      expect(error.metadata.get("x-should-retry"), form).toBe("true");
    }
    // Another key is served meanwhile.
    const ok = await sdk(stack, other.key).completions.create({ model: "tiny", prompt: "Hi", max_tokens: 5 });
    expect(ok.choices[0]?.text).toBe("ok");
    expect(upstream.held()).toBe(3);

    stop.abort();
    await Promise.all(held);
    await until(() => stack.admission.inFlight(id).requests === 0, "every place given back");
    await until(async () => (await ledger().usage(id)).openHolds === 0, "every Hold settled");

    // No leak: three at once are admitted again, and the fourth is refused again.
    const again = new AbortController();
    const held2 = [
      hold(stack, key, "connect", again.signal),
      hold(stack, key, "rest", again.signal),
      hold(stack, key, "rest-stream", again.signal),
    ];
    await until(() => upstream.held() === 3, "three requests held by Inference again");
    expect((await restRefusal(stack, key, false)).envelope.code).toBe("rate_limited");
    again.abort();
    await Promise.all(held2);
    await until(() => stack.admission.activeKeys === 0, "no key has a request in flight");
  });

  it("at its cap, a key still gets the 400 of a request no retry can pass (size cap, deadline_infeasible, no room for max_tokens), not a 429", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 100_000 });
    const stop = new AbortController();
    const held = [
      hold(stack, key, "rest", stop.signal),
      hold(stack, key, "rest", stop.signal),
      hold(stack, key, "rest", stop.signal),
    ];
    try {
      await until(() => stack.admission.inFlight(id).requests === 3, "the key at its request cap");
      await refusalsAtTheCap(key);
    } finally {
      stop.abort();
      await Promise.all(held);
    }
    await until(() => stack.admission.inFlight(id).requests === 0, "every place given back");
  });

  /** What `key`, at its request cap, is answered for requests no retry can pass, and for one that can. */
  async function refusalsAtTheCap(key: string): Promise<void> {
    const post = (body: object) =>
      exchange(stack.url, {
        path: "/v1/completions",
        headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        body: JSON.stringify({ model: "tiny", prompt: "Hi", ...body }),
      }).then((res) => decodeError("rest", res));
    // The seed's own example (proto/API.md §3): the size cap's message, whatever the key's load.
    const sizeCap = await post({ n: 2, max_tokens: 16001 });
    expect(sizeCap.httpStatus).toBe(400);
    expect(sizeCap.envelope.message).toBe(
      "At most 32000 generated tokens in all: n = 2 times max_tokens = 16001 for each of 1 prompts is 32002.",
    );
    const infeasible = await post({ max_tokens: 15601 });
    expect(infeasible.httpStatus).toBe(400);
    expect(infeasible.envelope.code).toBe("deadline_infeasible");
    // A max_tokens no prompt leaves room for (Inference's max_model_len is 512 here).
    const noRoom = await post({ max_tokens: 512 });
    expect(noRoom.httpStatus).toBe(400);
    expect(noRoom.envelope.code).toBe("context_length_exceeded");
    // A request a retry could pass is the cap's.
    expect((await post({ max_tokens: 5 })).envelope.code).toBe("rate_limited");
  }

  it("streams have a cap of their own: the stream past it is refused, a unary request of the same key is served", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 100_000 });
    const stop = new AbortController();
    const held = [hold(stack, key, "rest-stream", stop.signal), hold(stack, key, "rest-stream", stop.signal)];
    await until(() => upstream.held() === 2, "two streams held by Inference");

    const message =
      "This key already has 2 streams open: the per-key stream cap is 2 concurrent streams. Retry when one of them has finished.";
    const rest = await restRefusal(stack, key, true);
    expect(rest.httpStatus).toBe(429);
    expect(rest.envelope).toMatchObject({ type: "rate_limit_error", code: "rate_limited", message });
    expect(rest.metadata.get("retry-after")).toBe("1");
    for (const [form, req] of rpcRequests(key, "Hi", true)) {
      const error = decodeError(form, await exchange(stack.url, req));
      expect(error.envelope, form).toMatchObject({ code: "rate_limited", message });
      expect(error.metadata.get("retry-after"), form).toBe("1");
    }
    const ok = await sdk(stack, key).completions.create({ model: "tiny", prompt: "Hi", max_tokens: 5 });
    expect(ok.choices[0]?.text).toBe("ok");

    stop.abort();
    await Promise.all(held);
    await until(() => stack.admission.inFlight(id).requests === 0, "every place given back");
  });

  it("the place is given back on every end path: answered, refused after admission, Inference error, caller deadline", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 100_000 });
    const client = sdk(stack, key);
    const inFlight = () => stack.admission.inFlight(id).requests;
    // Answered, unary and streamed.
    await client.completions.create({ model: "tiny", prompt: "Hi", max_tokens: 5 });
    const s = await client.completions.create({ model: "tiny", prompt: "Hi", max_tokens: 5, stream: true });
    for await (const _ of s) {
      // read to the end
    }
    await until(() => inFlight() === 0, "answered requests gave their place back");
    // Refused by a check after admission: the prompt is counted (600 tokens > max_model_len 512).
    for (let i = 0; i < 4; i++) {
      const long = await exchange(stack.url, {
        path: "/v1/completions",
        headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        body: JSON.stringify({ model: "tiny", prompt: "x".repeat(600), max_tokens: 5 }),
      });
      expect(decodeError("rest", long).envelope.code).toBe("context_length_exceeded");
    }
    expect(inFlight()).toBe(0);
    // Inference fails (500), unary and streamed, more times than the cap.
    for (let i = 0; i < 4; i++) {
      for (const stream of [false, true]) {
        const res = await exchange(stack.url, {
          path: "/v1/completions",
          headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
          body: JSON.stringify({ model: "tiny", prompt: "fail", max_tokens: 5, stream }),
        });
        expect(res.status, `stream ${stream}`).toBe(502);
      }
    }
    await until(() => inFlight() === 0, "failed requests gave their place back");
    // The caller's deadline passes while Inference holds the request (Connect and gRPC).
    for (let i = 0; i < 4; i++) {
      const res = await exchange(stack.url, {
        path: "/acs.v1.CompletionsService/CreateCompletion",
        headers: {
          "content-type": "application/json",
          "connect-timeout-ms": "200",
          authorization: `Bearer ${key}`,
        },
        body: JSON.stringify({ model: "tiny", text: "hold", maxTokens: 5 }),
      });
      expect(decodeError("connect", res).envelope.code).toBe("deadline_exceeded");
    }
    await until(() => inFlight() === 0, "requests past their deadline gave their place back");
    // Three at once still fit.
    const stop = new AbortController();
    const held = [0, 1, 2].map(() => hold(stack, key, "rest", stop.signal));
    await until(() => upstream.held() === 3, "three requests held by Inference");
    stop.abort();
    await Promise.all(held);
    await until(() => inFlight() === 0, "every place given back");
  });
});

describe("one key's share of a model's upstream capacity", () => {
  let upstream: Awaited<ReturnType<typeof scriptedInference>>;
  let stack: Stack;
  beforeAll(async () => {
    upstream = await scriptedInference();
    stack = await startStack({
      upstreamUrl: upstream.url,
      dbPath: join(dir, "share.db"),
      // 4 concurrent completions in all; a key may hold half of them. The counts are not capped.
      model: { maxConcurrentRequests: 4 },
      maxRequestsPerKey: 0,
      maxStreamsPerKey: 0,
      maxUpstreamSharePerKey: 0.5,
    });
  });
  afterAll(async () => {
    await stack.close();
    await upstream.close();
  });

  it("a key past its share is refused (naming the share), and another key still gets the rest", async () => {
    const ledger = stack.ledger;
    if (ledger === undefined) throw new Error("no ledger");
    const a = await ledger.createKey({ budgetTokens: 100_000 });
    const b = await ledger.createKey({ budgetTokens: 100_000 });
    const stop = new AbortController();
    const held = [hold(stack, a.key, "rest", stop.signal), hold(stack, a.key, "rest-stream", stop.signal)];
    await until(() => upstream.held() === 2, "key A holds two requests");

    const message =
      "This key already has 2 requests in flight on acs/fake: the per-key share of a model's capacity is 50% of its 4 concurrent requests, 2 requests. Retry when one of them has finished.";
    for (const stream of [false, true]) {
      const rest = await restRefusal(stack, a.key, stream);
      expect(rest.httpStatus).toBe(429);
      expect(rest.envelope).toMatchObject({ type: "rate_limit_error", code: "rate_limited", message });
      expect(rest.metadata.get("retry-after")).toBe("1");
    }
    for (const [form, req] of rpcRequests(a.key)) {
      expect(decodeError(form, await exchange(stack.url, req)).envelope.message, form).toBe(message);
    }
    // Key B gets the other half of the model's capacity.
    held.push(hold(stack, b.key, "connect", stop.signal), hold(stack, b.key, "rest", stop.signal));
    await until(() => upstream.held() === 4, "key B holds two requests too");
    expect((await restRefusal(stack, b.key, false)).envelope.message).toBe(message);

    stop.abort();
    await Promise.all(held);
    await until(() => stack.admission.activeKeys === 0, "every place given back");
    // A key may take its share again.
    const again = new AbortController();
    const held2 = [hold(stack, a.key, "rest", again.signal), hold(stack, a.key, "connect", again.signal)];
    await until(() => upstream.held() === 2, "key A holds two requests again");
    again.abort();
    await Promise.all(held2);
  });
});

describe("keys off (loopback only)", () => {
  it("the caps do not apply: the one trusted caller is not limited", async () => {
    const upstream = await scriptedInference();
    const stack = await startStack({ upstreamUrl: upstream.url, maxRequestsPerKey: 1, maxStreamsPerKey: 1 });
    try {
      const stop = new AbortController();
      const held = [
        hold(stack, "none", "rest", stop.signal),
        hold(stack, "none", "rest-stream", stop.signal),
        hold(stack, "none", "rest-stream", stop.signal),
        hold(stack, "none", "connect", stop.signal),
      ];
      await until(() => upstream.held() === 4, "four requests held by Inference");
      expect(stack.admission.activeKeys).toBe(0);
      stop.abort();
      await Promise.all(held);
    } finally {
      await stack.close();
      await upstream.close();
    }
  });
});
