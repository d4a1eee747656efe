// OpenTelemetry spans, exported to the SDK's InMemorySpanExporter: the gateway request's span is
// the child of the caller's traceparent, the upstream call's span its child, and Inference gets the
// upstream span's context as traceparent. Also the OTLP/HTTP exporter against a loopback collector.
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { SpanKind, SpanStatusCode } from "@opentelemetry/api";
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { createTracing } from "../../src/telemetry/index.js";
import { until } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import {
  answerCompletion,
  chunk,
  type FakeUpstream,
  startFakeUpstream,
  withVllmOps,
} from "../upstream/fake-upstream.js";

function scripted(req: IncomingMessage, res: ServerResponse, body: string): void {
  const json = JSON.parse(body) as { prompt: string };
  if (req.url === "/tokenize") {
    res.setHeader("content-type", "application/json");
    const tokens = [...String(json.prompt)].map((_, i) => i + 1);
    res.end(JSON.stringify({ count: tokens.length, tokens, max_model_len: 512 }));
    return;
  }
  if (json.prompt === "fail") {
    res.statusCode = 500;
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ object: "error", message: "boom", type: "InternalServerError", code: 500 }));
    return;
  }
  answerCompletion(res, body, [
    chunk(0, "a", null, { token_ids: [7] }),
    chunk(0, "b", "length", { token_ids: [8] }),
  ]);
}

const exporter = new InMemorySpanExporter();
let upstream: FakeUpstream;
let stack: Stack;

beforeAll(async () => {
  upstream = await startFakeUpstream(withVllmOps(scripted));
  stack = await startStack({ upstreamUrl: upstream.url, tracing: createTracing({ exporter }) });
});
afterAll(async () => {
  await stack.close();
  await upstream.close();
});

const traceId = "0af7651916cd43dd8448eb211c80319c";
const callerSpanId = "b7ad6b7169203331";

/** The spans of trace `id` once `n` of them have ended. */
async function spansOf(id: string, n: number): Promise<ReadableSpan[]> {
  const of = () => exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === id);
  await until(() => of().length >= n, `${n} spans of trace ${id}`);
  return of();
}

describe("OpenTelemetry spans", () => {
  it("REST: gateway span ← caller's traceparent; upstream span ← gateway span; Inference gets it", async () => {
    const before = upstream.requests.length;
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        traceparent: `00-${traceId}-${callerSpanId}-01`,
        "x-request-id": "trace-test-1",
      },
      body: JSON.stringify({ model: "acs/fake", prompt: "Hi", max_tokens: 2 }),
    });
    expect(res.status).toBe(200);
    await res.text();
    const spans = await spansOf(traceId, 2);
    const gateway = spans.find((s) => s.kind === SpanKind.SERVER);
    const call = spans.find((s) => s.kind === SpanKind.CLIENT);
    expect(gateway?.name).toBe("POST /v1/completions");
    expect(gateway?.parentSpanContext?.spanId).toBe(callerSpanId);
    expect(gateway?.attributes).toMatchObject({
      "http.request.method": "POST",
      "http.route": "/v1/completions",
      "http.response.status_code": 200,
      "acs.protocol": "rest",
      "acs.request_id": "trace-test-1",
      "acs.model": "acs/fake",
      "gen_ai.usage.input_tokens": 2,
      "gen_ai.usage.output_tokens": 2,
    });
    expect(call?.name).toBe("upstream POST /v1/completions");
    expect(call?.parentSpanContext?.spanId).toBe(gateway?.spanContext().spanId);
    expect(call?.attributes).toMatchObject({
      "acs.model": "acs/fake",
      "acs.upstream.replica": upstream.url,
      "acs.upstream.request_id": "trace-test-1",
      "acs.upstream.attempt": 0,
      // A unary request is Inference's stream collected (keys off too): the silence bound needs it.
      "acs.upstream.stream": true,
      "url.full": `${upstream.url}/v1/completions`,
    });
    const seen = upstream.requests.slice(before).find((r) => r.url === "/v1/completions");
    expect(seen?.headers.traceparent).toBe(`00-${traceId}-${call?.spanContext().spanId}-01`);
  });

  it("Connect: the span is named by the RPC; an upstream failure marks both spans", async () => {
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const otherTrace = "1bf7651916cd43dd8448eb211c80319d";
    await client
      .createCompletion(
        { model: "acs/fake", prompt: { case: "text", value: "fail" }, maxTokens: 2 },
        { headers: { traceparent: `00-${otherTrace}-${callerSpanId}-01` } },
      )
      .catch(() => undefined);
    const spans = await spansOf(otherTrace, 2);
    const gateway = spans.find((s) => s.kind === SpanKind.SERVER);
    const call = spans.find((s) => s.kind === SpanKind.CLIENT);
    expect(gateway?.name).toBe("acs.v1.CompletionsService/CreateCompletion");
    expect(gateway?.attributes).toMatchObject({
      "rpc.system": "connect_rpc",
      "rpc.service": "acs.v1.CompletionsService",
      "rpc.method": "CreateCompletion",
      "acs.protocol": "connect",
      "error.type": "upstream_error",
    });
    expect(gateway?.status.code).toBe(SpanStatusCode.ERROR);
    expect(call?.parentSpanContext?.spanId).toBe(gateway?.spanContext().spanId);
    expect(call?.status.code).toBe(SpanStatusCode.ERROR);
    expect(call?.attributes["error.type"]).toBe("upstream_error");
  });

  it("without a traceparent, a new trace starts at the gateway span", async () => {
    exporter.reset();
    await (
      await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "acs/fake", prompt: "Hi", max_tokens: 2 }),
      })
    ).text();
    await until(() => exporter.getFinishedSpans().length >= 2, "two spans");
    const gateway = exporter.getFinishedSpans().find((s) => s.kind === SpanKind.SERVER);
    expect(gateway?.parentSpanContext).toBeUndefined();
  });
});

describe("OTLP/HTTP export", () => {
  it("sends the spans to the collector at the configured URL", async () => {
    const posts: Array<{ url: string; body: string }> = [];
    const collector = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        posts.push({ url: req.url ?? "", body: Buffer.concat(chunks).toString("utf8") });
        res.setHeader("content-type", "application/json");
        res.end("{}");
      });
    });
    await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve));
    const { port } = collector.address() as AddressInfo;
    const tracing = createTracing({ otlpTracesUrl: `http://127.0.0.1:${port}/v1/traces` });
    const otlpStack = await startStack({ upstreamUrl: upstream.url, tracing });
    try {
      await (
        await fetch(`${otlpStack.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "acs/fake", prompt: "Hi", max_tokens: 2 }),
        })
      ).text();
    } finally {
      // app.close() shuts the tracing down, which exports the batch.
      await otlpStack.close();
      await new Promise<void>((resolve) => collector.close(() => resolve()));
    }
    expect(posts.map((p) => p.url)).toContain("/v1/traces");
    const body = posts.map((p) => p.body).join("\n");
    expect(body).toContain("POST /v1/completions");
    expect(body).toContain("upstream POST /v1/completions");
    expect(body).toContain("acs-gateway");
  });
});
