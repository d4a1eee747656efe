// The request metrics on /metrics, scraped before and after real requests through REST and
// Connect (reference engine, keys on): each value moves by what the requests did.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { until } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { chunk, sse, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

let stack: Stack;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-metrics-"));
  stack = await startStack({ dbPath: join(dir, "acs.db") });
});
afterAll(async () => {
  await stack.close();
  rmSync(dir, { recursive: true, force: true });
});

const scrape = async () => (await fetch(`${stack.url}/metrics`)).text();

/** The value of `name` with (at least) `labels`, summed over the lines that match; 0 when none. */
function value(text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue;
    sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

async function rest(key: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: "tiny", prompt: "Hi", temperature: 0, ignore_eos: true, ...body }),
  });
}

/** "Hi" with BOS in the tiny tokenizer. */
const promptTokens = 3;

describe("/metrics after real requests", () => {
  it("REST unary: requests by route, model and status; tokens; time to first token and per token", async () => {
    const { key } = await (stack.ledger ?? assertNever()).createKey({ budgetTokens: 100_000 });
    const model = stack.modelId;
    const before = await scrape();
    const res = await rest(key, { max_tokens: 4 });
    expect(res.status).toBe(200);
    const usage = ((await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } })
      .usage;
    const route = { protocol: "rest", route: "/v1/completions", model, status: "200" };
    await until(
      async () =>
        value(await scrape(), "acs_requests_total", route) > value(before, "acs_requests_total", route),
      "the request counted",
    );
    const after = await scrape();
    const delta = (name: string, labels: Record<string, string> = {}) =>
      value(after, name, labels) - value(before, name, labels);
    expect(delta("acs_requests_total", route)).toBe(1);
    expect(delta("acs_prompt_tokens_total", { model })).toBe(usage.prompt_tokens);
    expect(delta("acs_completion_tokens_total", { model })).toBe(usage.completion_tokens);
    expect(usage).toMatchObject({ prompt_tokens: promptTokens, completion_tokens: 4 });
    expect(delta("acs_time_to_first_token_seconds_count", { model })).toBe(1);
    expect(delta("acs_time_per_output_token_seconds_count", { model })).toBe(1);
    expect(delta("acs_request_duration_seconds_count", { protocol: "rest", route: "/v1/completions" })).toBe(
      1,
    );
    expect(value(after, "acs_requests_in_flight", { protocol: "rest" })).toBe(0);
  });

  it("Connect stream: counted by RPC and gRPC code, its tokens by model", async () => {
    const { key } = await (stack.ledger ?? assertNever()).createKey({ budgetTokens: 100_000 });
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const rpc = {
      protocol: "connect",
      route: "/acs.v1.CompletionsService/StreamCompletion",
      model: stack.modelId,
      grpc_code: "ok",
    };
    const before = await scrape();
    const request = create(CreateCompletionRequestSchema, {
      model: "tiny",
      prompt: { case: "text", value: "Hi" },
      maxTokens: 3,
      temperature: 0,
      ignoreEos: true,
    });
    let tokens = 0;
    for await (const chunk of client.streamCompletion(request, {
      headers: { authorization: `Bearer ${key}` },
    })) {
      tokens += chunk.choices.length;
    }
    expect(tokens).toBe(3);
    await until(
      async () => value(await scrape(), "acs_requests_total", rpc) > value(before, "acs_requests_total", rpc),
      "the RPC counted",
    );
    const after = await scrape();
    expect(value(after, "acs_requests_total", rpc) - value(before, "acs_requests_total", rpc)).toBe(1);
    expect(value(after, "acs_streams_in_flight", { protocol: "connect" })).toBe(0);
    expect(
      value(after, "acs_completion_tokens_total", { model: stack.modelId }) -
        value(before, "acs_completion_tokens_total", { model: stack.modelId }),
    ).toBe(3);
  });

  it("the in-flight gauges count a stream while it runs (scripted upstream holding it open)", async () => {
    let release = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const upstream = await startFakeUpstream(
      withVllmOps(async (req, res, body) => {
        if (req.url === "/tokenize") {
          res.setHeader("content-type", "application/json");
          res.end(JSON.stringify({ count: 2, tokens: [1, 2], max_model_len: 512 }));
          return;
        }
        void body;
        res.setHeader("content-type", "text/event-stream");
        res.write(sse([chunk(0, "a", null, { token_ids: [7] })], false));
        await held;
        res.end(sse([chunk(0, "b", "length", { token_ids: [8] })]));
      }),
    );
    const heldStack = await startStack({ upstreamUrl: upstream.url });
    try {
      const client = createClient(
        CompletionsService,
        createConnectTransport({ baseUrl: heldStack.url, httpVersion: "1.1" }),
      );
      const scrapeHeld = async () => (await fetch(`${heldStack.url}/metrics`)).text();
      let during = "";
      let chunks = 0;
      for await (const _ of client.streamCompletion({
        model: "acs/fake",
        prompt: { case: "text", value: "Hi" },
        maxTokens: 2,
      })) {
        chunks++;
        if (during === "") {
          during = await scrapeHeld();
          release();
        }
      }
      expect(chunks).toBe(2);
      expect(value(during, "acs_streams_in_flight", { protocol: "connect" })).toBe(1);
      expect(value(during, "acs_requests_in_flight", { protocol: "connect" })).toBe(1);
      const ended = { protocol: "connect", route: "/acs.v1.CompletionsService/StreamCompletion" };
      await until(
        async () => value(await scrapeHeld(), "acs_requests_total", ended) === 1,
        "the stream counted",
      );
      const after = await scrapeHeld();
      expect(value(after, "acs_streams_in_flight", { protocol: "connect" })).toBe(0);
      expect(value(after, "acs_requests_in_flight", { protocol: "connect" })).toBe(0);
    } finally {
      release();
      await heldStack.close();
      await upstream.close();
    }
  });

  it("Budget: a clamp and a refusal are counted by model; a refusal's RPC code is resource_exhausted", async () => {
    const model = stack.modelId;
    // Room for the prompt and 2 tokens: max_tokens 50 is clamped to 2.
    const { key } = await (stack.ledger ?? assertNever()).createKey({ budgetTokens: promptTokens + 2 });
    const before = await scrape();
    const clamped = await rest(key, { max_tokens: 50 });
    expect(clamped.status).toBe(200);
    expect(clamped.headers.get("x-acs-max-tokens-clamped")).toBe("2");
    await clamped.text();
    // The Budget is spent: the next request is refused.
    const refused = await rest(key, { max_tokens: 5 });
    expect(refused.status).toBe(429);
    await refused.text();
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    await client
      .createCompletion(
        { model: "tiny", prompt: { case: "text", value: "Hi" }, maxTokens: 5 },
        { headers: { authorization: `Bearer ${key}` } },
      )
      .catch(() => undefined);
    const refusalRpc = {
      protocol: "connect",
      route: "/acs.v1.CompletionsService/CreateCompletion",
      grpc_code: "resource_exhausted",
    };
    await until(
      async () =>
        value(await scrape(), "acs_requests_total", refusalRpc) >
        value(before, "acs_requests_total", refusalRpc),
      "the refused RPC counted",
    );
    const after = await scrape();
    const delta = (name: string, labels: Record<string, string>) =>
      value(after, name, labels) - value(before, name, labels);
    expect(delta("acs_budget_clamps_total", { model })).toBe(1);
    expect(delta("acs_budget_refusals_total", { model })).toBe(2);
    expect(delta("acs_requests_total", { protocol: "rest", status: "429", model })).toBe(1);
    expect(delta("acs_requests_total", refusalRpc)).toBe(1);
  });

  it("lists the upstream error counter by model, replica and kind", async () => {
    const text = await scrape();
    expect(text).toContain("# TYPE acs_upstream_replica_errors_total counter");
    expect(text).toContain("# TYPE acs_time_to_first_token_seconds histogram");
  });
});

function assertNever(): never {
  throw new Error("no ledger");
}
