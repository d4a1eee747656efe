// Faults of Inference seen through the gateway: each gives the right envelope, nothing hangs,
// disconnects abort the upstream request.
import { EventEmitter } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

/**
 * A scripted misbehaving Inference: the prompt text picks the behaviour (`slow…`: never answers).
 * `whenAborted(prompt)` resolves once the gateway has dropped the request with that prompt.
 */
function createFakeUpstream() {
  const aborted: string[] = [];
  const abortEvents = new EventEmitter();
  const whenAborted = (prompt: string) =>
    new Promise<void>((resolve) => {
      if (aborted.includes(prompt)) return resolve();
      const listener = (p: string) => {
        if (p !== prompt) return;
        abortEvents.off("aborted", listener);
        resolve();
      };
      abortEvents.on("aborted", listener);
    });
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d) => {
      body += d;
    });
    req.on("end", () => {
      // Inference's ops routes, which the gateway's replica check reads.
      if (req.method === "GET" && req.url === "/health") {
        res.end();
        return;
      }
      if (req.method === "GET" && req.url === "/v1/models") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ object: "list", data: [{ id: "acs/fake", max_model_len: 512 }] }));
        return;
      }
      if (req.url === "/tokenize") {
        const { prompt } = JSON.parse(body) as { prompt: string };
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify({
            count: prompt.length,
            max_model_len: 512,
            tokens: [...prompt].map((c) => c.charCodeAt(0)),
          }),
        );
        return;
      }
      const json = JSON.parse(body) as { prompt: string; stream?: boolean; max_tokens?: number };
      const script = String(json.prompt);
      const chunk = (text: string, finish: string | null = null) =>
        `data: ${JSON.stringify({ id: "cmpl-x", object: "text_completion", created: 1, model: "acs/fake", choices: [{ index: 0, text, logprobs: null, finish_reason: finish, stop_reason: null, token_ids: [1] }], usage: null })}\n\n`;
      req.socket.on("close", () => {
        if (res.writableEnded) return;
        aborted.push(script);
        abortEvents.emit("aborted", script);
      });
      if (script.startsWith("slow")) return; // never answers; the gateway's deadline must fire
      switch (script) {
        case "http500":
          res.writeHead(500, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              error: { message: "boom", type: "InternalServerError", param: null, code: 500 },
            }),
          );
          return;
        case "error200":
          res.writeHead(200, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              error: {
                message: "Token id 999999 is out of vocabulary",
                type: "BadRequestError",
                param: null,
                code: 400,
              },
            }),
          );
          return;
        case "huge-400":
          // vLLM's pydantic messages can echo a whole field: 200 KB of message and of param
          res.writeHead(400, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              error: {
                message: `Input should be short [input_value='${"x".repeat(200_000)}']`,
                type: "BadRequestError",
                param: "p".repeat(200_000),
                code: 400,
              },
            }),
          );
          return;
        case "inband-first":
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end(
            `data: ${JSON.stringify({ error: { message: "Token id 999999 is out of vocabulary", type: "BadRequestError", param: null, code: 400 } })}\n\ndata: [DONE]\n\n`,
          );
          return;
        case "inband-later":
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end(
            `${chunk("a")}${chunk("b")}data: ${JSON.stringify({ error: { message: "engine died", type: "InternalServerError", param: null, code: 500 } })}\n\ndata: [DONE]\n\n`,
          );
          return;
        case "reset-mid-stream":
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.write(chunk("a"));
          setTimeout(() => req.socket.destroy(), 20);
          return;
        case "garbage":
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end(`${chunk("a")}data: {not json\n\ndata: [DONE]\n\n`);
          return;
        case "echo-max-tokens": {
          // answers with the max_tokens the gateway sent, as the text
          const text = String(json.max_tokens);
          if (json.stream) {
            res.writeHead(200, { "content-type": "text/event-stream" });
            res.end(`${chunk(text, "length")}data: [DONE]\n\n`);
          } else {
            res.writeHead(200, { "content-type": "application/json" });
            res.end(
              JSON.stringify({
                id: "cmpl-x",
                object: "text_completion",
                created: 1,
                model: "acs/fake",
                choices: [{ index: 0, text, logprobs: null, finish_reason: "length", stop_reason: null }],
                usage: { prompt_tokens: 15, completion_tokens: 1, total_tokens: 16 },
              }),
            );
          }
          return;
        }
        default:
          res.writeHead(404);
          res.end();
      }
    });
  });
  return { server, whenAborted };
}

let fake: ReturnType<typeof createFakeUpstream>;
let stack: Stack;
/** Like `stack`, with a 300 ms deadline for non-streamed answers (the only stack that has one). */
let shortDeadline: Stack;
let refused: Stack;

beforeAll(async () => {
  fake = createFakeUpstream();
  await new Promise<void>((r) => fake.server.listen(0, "127.0.0.1", r));
  const port = (fake.server.address() as AddressInfo).port;
  stack = await startStack({ upstreamUrl: `http://127.0.0.1:${port}` });
  shortDeadline = await startStack({ upstreamUrl: `http://127.0.0.1:${port}`, nonStreamDeadlineMs: 300 });
  // A port nobody listens on: connection refused.
  const closed = http.createServer();
  await new Promise<void>((r) => closed.listen(0, "127.0.0.1", r));
  const closedPort = (closed.address() as AddressInfo).port;
  await new Promise<void>((r) => closed.close(() => r()));
  refused = await startStack({ upstreamUrl: `http://127.0.0.1:${closedPort}` });
});
afterAll(async () => {
  await stack.close();
  await shortDeadline.close();
  await refused.close();
  fake.server.closeAllConnections();
  await new Promise<void>((r) => fake.server.close(() => r()));
});

async function call(s: Stack, prompt: string, stream = false) {
  const res = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: s.alias, prompt, max_tokens: 4, stream }),
  });
  return { res, text: await res.text() };
}

describe("Inference faults become the right envelope", () => {
  it.each([
    ["http500", false, 502, "upstream_error"],
    ["error200", false, 400, "invalid_request"],
    ["inband-first", true, 400, "invalid_request"],
    ["slow", false, 504, "deadline_exceeded"],
  ])("%s (stream %s) → %i %s", async (prompt, stream, status, code) => {
    // only the fake's "slow" never answers: it alone meets a deadline short enough to wait for
    const { res, text } = await call(prompt === "slow" ? shortDeadline : stack, prompt, stream);
    expect(res.status).toBe(status);
    const json = JSON.parse(text) as {
      error: { code: string; type: string; message: string };
      request_id: string;
    };
    expect(json.error.code).toBe(code);
    expect(json.request_id).toBe(res.headers.get("x-request-id"));
    // Inference's class names and integer codes never reach callers
    expect(json.error.type).not.toMatch(/Error$/);
    if (code === "invalid_request") expect(json.error.message).toContain("out of vocabulary");
  });

  it("aborts the upstream request when the deadline passes", async () => {
    const prompt = "slow, then aborted";
    const aborted = fake.whenAborted(prompt);
    const { res } = await call(shortDeadline, prompt);
    expect(res.status).toBe(504);
    await aborted;
  });

  it("connection refused → 503 upstream_unavailable", async () => {
    const { res, text } = await call(refused, "x");
    expect(res.status).toBe(503);
    expect((JSON.parse(text) as { error: { code: string } }).error.code).toBe("upstream_unavailable");
  });

  it.each([
    ["inband-later", "upstream_error"],
    ["reset-mid-stream", "upstream_error"],
    ["garbage", "upstream_error"],
  ])("%s after the stream started → one error event, then [DONE]", async (prompt, code) => {
    const { res, text } = await call(stack, prompt, true);
    expect(res.status).toBe(200);
    // sseChunks/parseSse throw on any event:, id: or retry: line and on a missing [DONE]
    const chunks = sseChunks(text);
    expect(chunks[chunks.length - 1]).toMatchObject({
      error: { code },
      request_id: res.headers.get("x-request-id"),
    });
    expect(chunks.slice(0, -1).every((c) => !("error" in c))).toBe(true);
    expect(chunks[0]).toMatchObject({ choices: [{ text: "a" }] });
  });
});

describe("Inference's messages are clipped like caller text", () => {
  it("a 200 KB message and param from Inference reach the caller as 1,024 and 200 characters + …", async () => {
    const { res, text } = await call(stack, "huge-400");
    expect(res.status).toBe(400);
    const json = JSON.parse(text) as { error: { code: string; message: string; param: string } };
    expect(json.error.code).toBe("invalid_request");
    expect(json.error.message).toBe(`Input should be short [input_value='${"x".repeat(1024 - 36)}…`);
    expect(json.error.param).toBe(`${"p".repeat(200)}…`);
    expect(text.length).toBeLessThan(2000);
  });
});

describe("disconnects", () => {
  let engineStack: Stack;
  beforeAll(async () => {
    engineStack = await startStack();
  });
  afterAll(async () => {
    await engineStack.close();
  });

  it.each([true, false])(
    "a caller that disconnects (stream %s) aborts the Inference request before it is done",
    async (stream) => {
      const engine = engineStack.engine;
      if (!engine) throw new Error("no engine");
      const abortedBefore = engine.stats.aborted;
      const completedBefore = engine.stats.completed;
      const controller = new AbortController();
      const maxTokens = engine.model.maxModelLen - engine.model.tokenize("Hi").length;
      const request = fetch(`${engineStack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "tiny",
          prompt: "Hi",
          max_tokens: maxTokens,
          ignore_eos: true,
          stream,
        }),
        signal: controller.signal,
      });
      if (stream) {
        const res = await request;
        await res.body?.getReader().read();
      } else {
        await until(() => engine.stats.active > 0, "the engine is generating");
      }
      controller.abort();
      await request.catch(() => undefined);
      // the engine counts each request it ends as aborted or completed (run to max_tokens)
      const ended = () => engine.stats.aborted + engine.stats.completed - abortedBefore - completedBefore;
      await until(() => ended() > 0, "the engine ended the request");
      expect(engine.stats).toMatchObject({ aborted: abortedBefore + 1, completed: completedBefore });
    },
  );
});

describe("the default max_tokens with a long max_model_len (proto/API.md §3)", () => {
  let longContext: Stack;
  beforeAll(async () => {
    const port = (fake.server.address() as AddressInfo).port;
    longContext = await startStack({
      upstreamUrl: `http://127.0.0.1:${port}`,
      model: { maxModelLen: 100_000 },
    });
  });
  afterAll(async () => {
    await longContext.close();
  });

  async function sentMaxTokens(body: Record<string, unknown>): Promise<string> {
    const res = await fetch(`${longContext.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: longContext.alias, prompt: "echo-max-tokens", ...body }),
    });
    expect(res.status).toBe(200);
    if (body.stream)
      return sseChunks<{ choices: Array<{ text: string }> }>(await res.text())[0]?.choices[0]?.text ?? "";
    return ((await res.json()) as { choices: Array<{ text: string }> }).choices[0]?.text ?? "";
  }

  it("is at most 15,600 without stream", async () => {
    expect(await sentMaxTokens({})).toBe("15600");
  });
  it("is at most 32,000 with stream", async () => {
    expect(await sentMaxTokens({ stream: true })).toBe("32000");
  });
  it("is max_model_len less the prompt when that is smaller", async () => {
    // the fake tokenizer counts one token per character: "echo-max-tokens" is 15 tokens
    const port = (fake.server.address() as AddressInfo).port;
    const s = await startStack({ upstreamUrl: `http://127.0.0.1:${port}`, model: { maxModelLen: 1000 } });
    try {
      const res = await fetch(`${s.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: s.alias, prompt: "echo-max-tokens" }),
      });
      expect(((await res.json()) as { choices: Array<{ text: string }> }).choices[0]?.text).toBe(
        String(1000 - 15),
      );
    } finally {
      await s.close();
    }
  });
});
