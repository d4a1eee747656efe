// A 429 says whether to retry: `x-should-retry: false` when the key's Budget is spent (the OpenAI
// SDK then does not retry: the gateway sees one request), `Retry-After` when only the Holds of
// requests in flight block it (the SDK waits and retries). Connect, gRPC and gRPC-Web carry the
// same headers (response headers, trailers, end-of-stream metadata).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { decodeError, type ErrorForm, exchange, frame, type WireRequest } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { type FakeUpstream, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

let upstream: FakeUpstream;
let stack: Stack;
let dir: string;

/** Inference: a token per character; the prompt "hold" is never answered, others get one token. */
beforeAll(async () => {
  upstream = await startFakeUpstream(
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
      if (json.prompt === "hold") return;
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
  dir = mkdtempSync(join(tmpdir(), "acs-retry-"));
  stack = await startStack({ upstreamUrl: upstream.url, dbPath: join(dir, "acs.db") });
});
afterAll(async () => {
  await stack.close();
  await upstream.close();
  rmSync(dir, { recursive: true, force: true });
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

const ledger = () => {
  if (!stack.ledger) throw new Error("no ledger");
  return stack.ledger;
};

/** 429s the gateway answered on POST /v1/completions, from its Prometheus counter. */
async function rest429s(): Promise<number> {
  const text = await (await checkedFetch(`${stack.url}/metrics`)).text();
  const line = text
    .split("\n")
    .find(
      (l) =>
        l.startsWith("acs_requests_total{") &&
        l.includes('route="/v1/completions"') &&
        l.includes('status="429"'),
    );
  return line === undefined ? 0 : Number(line.split(" ").at(-1));
}

const sdk = (key: string) =>
  new OpenAI({ apiKey: key, baseURL: `${stack.url}/v1`, maxRetries: 2, fetch: checkedFetch });

async function sdkError(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  try {
    await p;
  } catch (err) {
    if (err instanceof OpenAI.APIError) return err;
    throw err;
  }
  throw new Error("no error");
}

/** The same refused request on the RPC surfaces (JSON where there is a choice). */
function rpcRequests(key: string): [ErrorForm, WireRequest][] {
  const json = new TextEncoder().encode('{"model":"tiny","text":"Hi","maxTokens":10}');
  const auth = { authorization: `Bearer ${key}` };
  const path = "/acs.v1.CompletionsService/CreateCompletion";
  return [
    ["connect", { path, headers: { "content-type": "application/json", ...auth }, body: json }],
    [
      "connect-stream",
      {
        path: "/acs.v1.CompletionsService/StreamCompletion",
        headers: { "content-type": "application/connect+json", ...auth },
        body: frame(json),
      },
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
}

describe("a spent Budget: x-should-retry: false", () => {
  it("the OpenAI SDK does not retry: the gateway sees one request", async () => {
    const { key } = await ledger().createKey({ budgetTokens: 2 }); // "Hi" needs 2 + 1 tokens
    const before = await rest429s();
    const err = await sdkError(sdk(key).completions.create({ model: "tiny", prompt: "Hi", max_tokens: 10 }));
    expect(err.status).toBe(429);
    expect(err.headers?.get("x-should-retry")).toBe("false");
    expect(err.headers?.get("retry-after")).toBeNull();
    expect((err.error as { code: string }).code).toBe("insufficient_quota");
    expect(await rest429s()).toBe(before + 1);
  });

  it.each([0, 1, 2, 3])("RPC surface %# carries the same advice", async (i) => {
    const { key } = await ledger().createKey({ budgetTokens: 2 });
    const [form, req] = rpcRequests(key)[i] as [ErrorForm, WireRequest];
    const error = decodeError(form, await exchange(stack.url, req));
    expect(error.envelope.code).toBe("insufficient_quota");
    expect(error.metadata.get("x-should-retry")).toBe("false");
    expect(error.metadata.get("retry-after")).toBeNull();
  });
});

describe("Holds in flight block the request: Retry-After", () => {
  it("the SDK waits and retries (three requests); the request fits once the Hold settles", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 20 });
    // A request Inference never answers holds 4 + 14 = 18 of the 20 tokens.
    const blocker = new AbortController();
    const blocked = checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: "tiny", prompt: "hold", max_tokens: 14, stream: true }),
      signal: blocker.signal,
    }).catch(() => undefined);
    await expect.poll(async () => (await ledger().usage(id)).openHolds, { timeout: 5000 }).toBe(1);

    // "Hi" needs at least 3; 2 are left, but 20 would be once the Hold settles.
    const before = await rest429s();
    const err = await sdkError(sdk(key).completions.create({ model: "tiny", prompt: "Hi", max_tokens: 10 }));
    expect(err.status).toBe(429);
    expect(err.headers?.get("retry-after")).toBe("1");
    expect(err.headers?.get("x-should-retry")).toBe("true");
    expect(await rest429s()).toBe(before + 3);

    for (const [form, req] of rpcRequests(key)) {
      const error = decodeError(form, await exchange(stack.url, req));
      expect(error.envelope.code, form).toBe("insufficient_quota");
      expect(error.metadata.get("retry-after"), form).toBe("1");
      expect(error.metadata.get("x-should-retry"), form).toBe("true");
    }

    blocker.abort();
    await blocked;
    await expect.poll(async () => (await ledger().usage(id)).openHolds, { timeout: 5000 }).toBe(0);
    const ok = await sdk(key).completions.create({ model: "tiny", prompt: "Hi", max_tokens: 10 });
    expect(ok.choices[0]?.text).toBe("ok");
  });
});

describe("a caller's deadline settles the Hold", () => {
  it.each([
    ["Connect", { "content-type": "application/json", "connect-timeout-ms": "500" }, false],
    ["gRPC", { "content-type": "application/grpc+json", "grpc-timeout": "500m" }, true],
  ] as const)("%s", async (_name, headers, grpc) => {
    const { id, key } = await ledger().createKey({ budgetTokens: 1000 });
    const json = new TextEncoder().encode('{"model":"tiny","text":"hold","maxTokens":10}');
    const res = await exchange(stack.url, {
      ...(grpc ? { http2: true } : {}),
      path: "/acs.v1.CompletionsService/CreateCompletion",
      headers: { ...headers, authorization: `Bearer ${key}` },
      body: grpc ? frame(json) : json,
    });
    expect(decodeError(grpc ? "grpc" : "connect", res).envelope.code).toBe("deadline_exceeded");
    await expect.poll(async () => (await ledger().usage(id)).openHolds, { timeout: 5000 }).toBe(0);
    // Inference generated nothing: the prompt is charged, the rest of the Hold released.
    expect((await ledger().usage(id)).spentTokens).toBeLessThanOrEqual(4);
  });
});
