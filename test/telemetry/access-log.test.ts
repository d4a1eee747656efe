// The access log: one info line per request on every surface, read from the gateway's logger
// destination, with the request id of the response, the key's name (never the key), tokens, time
// to first token, and cancels at info.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { createLogger } from "../../src/telemetry/index.js";
import { until } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

type Line = Record<string, unknown>;
const lines: Line[] = [];
let stack: Stack;
let dir: string;
let h2: Http2SessionManager;
let key: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-access-log-"));
  const logger = createLogger({
    level: "info",
    format: "json",
    destination: { write: (s: string) => void lines.push(JSON.parse(s) as Line) },
  });
  stack = await startStack({ dbPath: join(dir, "acs.db"), logger });
  h2 = new Http2SessionManager(stack.url);
  if (stack.ledger === undefined) throw new Error("no ledger");
  ({ key } = await stack.ledger.createKey({ name: "alice", budgetTokens: 1_000_000 }));
});
afterAll(async () => {
  h2.abort();
  await stack.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The access line of request `id`, once it is written. */
async function accessLine(id: string | null | undefined): Promise<Line> {
  if (typeof id !== "string") throw new Error("no request id");
  const find = () => lines.find((l) => l.msg === "request" && l.requestId === id);
  await until(() => find() !== undefined, `the access line of ${id}`);
  return find() as Line;
}

/** Every line about request `id`. */
const linesOf = (id: string) => lines.filter((l) => l.requestId === id);

const sdk = () => new OpenAI({ apiKey: key, baseURL: `${stack.url}/v1`, maxRetries: 0 });
const small = { model: "tiny", prompt: "Hi", max_tokens: 2, temperature: 0, ignore_eos: true } as const;
const greedy = (maxTokens: number) =>
  create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: { case: "text", value: "Hi" },
    maxTokens,
    temperature: 0,
    ignoreEos: true,
  });
const auth = () => ({ authorization: `Bearer ${key}` });

/** Checks the fields every completion line has, and that the key never appears. */
function expectCompletionLine(line: Line, fields: Line): void {
  expect(line).toMatchObject({ level: 30, keyName: "alice", model: stack.modelId, ...fields });
  expect(typeof line.durationMs).toBe("number");
  expect(typeof line.ttftMs).toBe("number");
  expect(line.ttftMs as number).toBeLessThanOrEqual(line.durationMs as number);
  expect(JSON.stringify(line)).not.toContain(key);
  // One name for the request id: fastify's reqId label is not used.
  expect(line).not.toHaveProperty("reqId");
}

describe("access log", () => {
  it("REST unary: method, route, status, model, key name, tokens, time to first token", async () => {
    const { response } = await sdk().completions.create(small).withResponse();
    const line = await accessLine(response.headers.get("x-request-id"));
    expectCompletionLine(line, {
      method: "POST",
      route: "/v1/completions",
      protocol: "rest",
      status: 200,
      promptTokens: 3,
      completionTokens: 2,
    });
    expect(line).not.toHaveProperty("stream");
  });

  it("REST SSE: the stream's line once it has ended", async () => {
    const { data: stream, response } = await sdk()
      .completions.create({ ...small, stream: true })
      .withResponse();
    for await (const _ of stream) {
      // read to the end
    }
    const line = await accessLine(response.headers.get("x-request-id"));
    expectCompletionLine(line, {
      route: "/v1/completions",
      protocol: "rest",
      status: 200,
      stream: true,
      completionTokens: 2,
    });
  });

  it("Connect unary and gRPC stream: the RPC and its gRPC code", async () => {
    let connectId: string | null = null;
    const connect = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    await connect.createCompletion(greedy(2), {
      headers: auth(),
      onHeader: (h) => {
        connectId = h.get("x-request-id");
      },
    });
    expectCompletionLine(await accessLine(connectId), {
      method: "POST",
      route: "/acs.v1.CompletionsService/CreateCompletion",
      protocol: "connect",
      status: 200,
      grpcCode: "ok",
      completionTokens: 2,
    });

    let grpcId: string | null = null;
    const grpc = createClient(
      CompletionsService,
      createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 }),
    );
    for await (const _ of grpc.streamCompletion(greedy(3), {
      headers: auth(),
      onHeader: (h) => {
        grpcId = h.get("x-request-id");
      },
    })) {
      // read to the end
    }
    expectCompletionLine(await accessLine(grpcId), {
      route: "/acs.v1.CompletionsService/StreamCompletion",
      protocol: "grpc",
      grpcCode: "ok",
      stream: true,
      completionTokens: 3,
    });
  });

  it("a refusal: its status or gRPC code and its error code, at info", async () => {
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...auth() },
      body: JSON.stringify({ ...small, max_tokens: -1 }),
    });
    expect(res.status).toBe(400);
    const line = await accessLine(res.headers.get("x-request-id"));
    expect(line).toMatchObject({ level: 30, status: 400, error: "invalid_request", keyName: "alice" });

    const connect = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const err = await connect
      .createCompletion({ ...greedy(2), model: "no-such-model" }, { headers: auth() })
      .then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    const rpcLine = await accessLine(err?.metadata.get("x-request-id"));
    expect(rpcLine).toMatchObject({
      level: 30,
      protocol: "connect",
      status: 404,
      grpcCode: "not_found",
      error: "model_not_found",
    });
    expect(rpcLine).not.toHaveProperty("model");
  });

  it("a caller's cancel is one info line (REST 499, gRPC canceled) and no error line", async () => {
    const ledger = stack.ledger;
    if (ledger === undefined) throw new Error("no ledger");
    const aliceId = (await ledger.listKeys()).find((k) => k.name === "alice")?.id ?? "";
    const spentBefore = (await ledger.usage(aliceId)).spentTokens;
    const controller = new AbortController();
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...auth() },
      body: JSON.stringify({ ...small, max_tokens: 400, stream: true }),
      signal: controller.signal,
    });
    const reader = res.body?.getReader();
    await reader?.read();
    controller.abort();
    const id = res.headers.get("x-request-id") as string;
    const line = await accessLine(id);
    expect(line).toMatchObject({ level: 30, status: 499, canceled: true, stream: true, keyName: "alice" });
    expect(linesOf(id).filter((l) => (l.level as number) >= 40)).toEqual([]);
    // The line waited for the tokens of the aborted request: what its key is charged.
    expect(line.promptTokens).toBe(3); // "Hi" with BOS in the tiny tokenizer
    expect(line.completionTokens as number).toBeGreaterThanOrEqual(1);
    await until(
      async () => (await ledger.usage(aliceId)).openHolds === 0,
      "the canceled stream's Hold settled",
    );
    const spentAfter = (await ledger.usage(aliceId)).spentTokens;
    expect(spentAfter - spentBefore).toBe((line.promptTokens as number) + (line.completionTokens as number));

    const grpc = createClient(
      CompletionsService,
      createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 }),
    );
    const rpcAbort = new AbortController();
    let grpcId: string | null = null;
    try {
      for await (const _ of grpc.streamCompletion(greedy(400), {
        headers: auth(),
        signal: rpcAbort.signal,
        onHeader: (h) => {
          grpcId = h.get("x-request-id");
        },
      })) {
        rpcAbort.abort();
      }
    } catch {
      // canceled by us
    }
    const rpcLine = await accessLine(grpcId);
    expect(rpcLine).toMatchObject({ level: 30, protocol: "grpc", grpcCode: "canceled", canceled: true });
    expect(rpcLine.promptTokens).toBe(3);
    expect(rpcLine.completionTokens as number).toBeGreaterThanOrEqual(1);
    expect(linesOf(grpcId ?? "").filter((l) => (l.level as number) >= 40)).toEqual([]);
  });

  it("probes and scrapes are logged at debug, not info", async () => {
    const res = await fetch(`${stack.url}/healthz`);
    const id = res.headers.get("x-request-id") as string;
    await fetch(`${stack.url}/v1/models`, { headers: auth() });
    // The logger is at info: the probe's line is not written, while the next request's is.
    const models = await fetch(`${stack.url}/v1/models`, { headers: auth() });
    await accessLine(models.headers.get("x-request-id"));
    expect(linesOf(id)).toEqual([]);
  });
});
