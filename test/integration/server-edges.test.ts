// The edges of the one-port server: slow and silent connections are cut off (HTTP/1.1 and h2c),
// HTTP/2 sessions advertise their limits and close gracefully, a request Node cannot parse is
// answered after the pipelined requests before it, errors raised before routing keep the
// envelope, 413 on every surface (Connect, gRPC and gRPC-Web included) carries the envelope,
// Connect JSON is strict about unknown fields, and many prompts print no process warning.
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import http2 from "node:http2";
import net from "node:net";
import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { endStreamFlag, endStreamFromJson, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { h2SessionLimits } from "../../src/app/index.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack({
    timeouts: { firstBytesMs: 300, headersMs: 400, requestMs: 600, h2IdleMs: 800 },
  });
});
afterAll(async () => {
  await stack.close();
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

const port = () => Number(new URL(stack.url).port);

/**
 * Opens a raw connection and writes `data`. Resolves once the server has cut it off, or a contrast
 * timer of 10 × `configuredMs` (started when the server accepted the connection) fired first:
 * `cutOff` says which, `afterMs` how long the server took. The server's timeouts and the contrast
 * are timers of this one process, and Node runs due timers in the order they fall due: however
 * late a busy machine runs them, a server that applies `configuredMs` cuts off first, and one
 * that falls back on Node's defaults (60 s and more) never does.
 */
async function cutOffBeforeContrast(
  data: string | undefined,
  configuredMs: number,
): Promise<{ cutOff: boolean; afterMs: number }> {
  const accepted = once(stack.server, "connection") as Promise<[net.Socket]>;
  const client = net.connect(port(), "127.0.0.1", () => {
    if (data !== undefined) client.write(data);
  });
  client.on("data", () => {});
  client.on("error", () => {});
  const [socket] = await accepted;
  const t0 = performance.now();
  return new Promise((resolve) => {
    const contrast = setTimeout(() => {
      // a server timeout due before this one has run already, and destroyed the socket
      resolve({ cutOff: socket.destroyed, afterMs: performance.now() - t0 });
      client.destroy();
    }, configuredMs * 10);
    socket.once("close", () => {
      clearTimeout(contrast);
      resolve({ cutOff: true, afterMs: performance.now() - t0 });
    });
  });
}

describe("slow and silent clients are cut off by the configured timeouts", () => {
  // Lower bound: timers never fire early (half of it, for the event loop's cached clock).
  it("a connection that sends nothing (firstBytesMs)", async () => {
    const r = await cutOffBeforeContrast(undefined, 300);
    expect(r.cutOff).toBe(true);
    expect(r.afterMs).toBeGreaterThanOrEqual(150);
  });
  it("headers that never end, slowloris (headersMs)", async () => {
    const r = await cutOffBeforeContrast("POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 400);
    expect(r.cutOff).toBe(true);
    expect(r.afterMs).toBeGreaterThanOrEqual(200);
  });
  it("a body that never arrives (requestMs)", async () => {
    const head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    const r = await cutOffBeforeContrast(head, 600);
    expect(r.cutOff).toBe(true);
    expect(r.afterMs).toBeGreaterThanOrEqual(300);
  });

  it("an HTTP/2 preface dripped a byte at a time is cut at the first-bytes deadline", async () => {
    const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const sent = await new Promise<number>((resolve) => {
      let i = 0;
      const socket = net.connect(port(), "127.0.0.1");
      // every gap (100 ms) is shorter than the 300 ms deadline; the whole preface is longer
      const drip = setInterval(() => {
        if (i < preface.length) socket.write(preface.charAt(i++));
        else socket.destroy(); // sent in full: the deadline did not cut it
      }, 100);
      socket.on("error", () => {});
      socket.on("close", () => {
        clearInterval(drip);
        resolve(i);
      });
    });
    expect(sent).toBeLessThan(preface.length);
  });

  it("an HTTP/2 request body still arriving at the request deadline: stream reset, session closed", async () => {
    const session = http2.connect(stack.url);
    session.on("error", () => {});
    const sessionClosed = new Promise<void>((resolve) => session.once("close", resolve));
    const req = session.request({
      ":method": "POST",
      ":path": "/acs.v1.CompletionsService/CreateCompletion",
      "content-type": "application/grpc+proto",
      te: "trailers",
    });
    req.on("error", () => {});
    req.resume();
    // a gRPC message of 100 bytes, a byte every 50 ms (the session never idles), ended if not cut
    const body = encodeEnvelope(0, new Uint8Array(100));
    let i = 0;
    const drip = setInterval(() => {
      if (i < body.length) req.write(body.subarray(i, ++i));
      else req.end();
    }, 50);
    await new Promise((resolve) => req.once("close", resolve));
    clearInterval(drip);
    expect(i).toBeLessThan(body.length);
    expect(req.rstCode).toBe(http2.constants.NGHTTP2_CANCEL);
    await sessionClosed;
    expect(session.destroyed).toBe(true);
  });

  it("an HTTP/2 HEADERS frame dripped a byte at a time: the session is closed at h2IdleMs", async () => {
    // HEADERS (END_HEADERS, stream 1): HPACK literal "x" with a 100-byte value. Its bytes come one
    // every 100 ms, each gap shorter than h2IdleMs (800 ms), the whole frame far longer.
    const block = Buffer.concat([Buffer.of(0x00, 0x01, 0x78, 100), Buffer.alloc(100, 0x61)]);
    const frameHead = Buffer.alloc(9);
    frameHead.writeUIntBE(block.length, 0, 3);
    frameHead.writeUInt8(0x1, 3); // HEADERS
    frameHead.writeUInt8(0x4, 4); // END_HEADERS
    frameHead.writeUInt32BE(1, 5);
    const settings = Buffer.of(0, 0, 0, 0x4, 0, 0, 0, 0, 0);
    const sent = await new Promise<number>((resolve) => {
      let i = 0;
      const socket = net.connect(port(), "127.0.0.1", () => {
        socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), settings, frameHead]));
      });
      const drip = setInterval(() => {
        if (i < block.length) socket.write(block.subarray(i, ++i));
        else socket.destroy(); // sent in full: nothing cut it
      }, 100);
      socket.on("data", () => {});
      socket.on("error", () => {});
      socket.on("close", () => {
        clearInterval(drip);
        resolve(i);
      });
    });
    expect(sent).toBeLessThan(block.length);
  });
});

describe("HTTP/2 sessions", () => {
  it("advertise their concurrent-stream limit", async () => {
    const session = http2.connect(stack.url);
    try {
      const settings = await new Promise<http2.Settings>((resolve) =>
        session.once("remoteSettings", resolve),
      );
      expect(settings.maxConcurrentStreams).toBe(h2SessionLimits.maxConcurrentStreams);
    } finally {
      session.destroy();
    }
  });

  it("closing the gateway ends open streams cleanly and closes every session", async () => {
    const own = await startStack();
    const idle = http2.connect(own.url);
    const busy = http2.connect(own.url);
    const closed = [idle, busy].map((s) => new Promise<void>((resolve) => s.once("close", resolve)));
    await new Promise((resolve) => idle.once("remoteSettings", resolve));
    const req = busy.request({
      ":method": "POST",
      ":path": "/v1/completions",
      "content-type": "application/json",
    });
    req.end(JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 400, ignore_eos: true, stream: true }));
    req.setEncoding("utf8");
    let text = "";
    req.on("data", (chunk: string) => {
      text += chunk;
    });
    await new Promise((resolve) => req.once("data", resolve));
    const closing = own.close(); // mid-stream: the stream ends with the shutdown error, then [DONE]
    await new Promise((resolve) => req.once("close", resolve));
    await closing;
    await Promise.all(closed);
    expect(req.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
    expect(text).toContain('"code":"upstream_unavailable"');
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
  });

  it("a client that never closes its side does not hold the gateway's shutdown", async () => {
    const own = await startStack({ timeouts: { closeGraceMs: 300 } });
    // h2c preface and SETTINGS, then nothing: not even a close after the server's FIN
    const socket = net.connect({
      port: Number(new URL(own.url).port),
      host: "127.0.0.1",
      allowHalfOpen: true,
    });
    socket.on("data", () => {});
    socket.on("error", () => {});
    socket.write(
      Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Buffer.of(0, 0, 0, 4, 0, 0, 0, 0, 0)]),
    );
    await new Promise((resolve) => socket.once("data", resolve)); // the server's SETTINGS: a session
    let guard: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        own.close(),
        new Promise((_, reject) => {
          guard = setTimeout(() => reject(new Error("close() still waiting after 10 s")), 10_000);
        }),
      ]);
    } finally {
      clearTimeout(guard);
      socket.destroy();
    }
    expect(socket.readableEnded).toBe(true); // the server's FIN arrived
  });
});

/** Writes `data` on a raw connection and resolves with all it receives until the server closes it. */
function exchange(data: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port(), "127.0.0.1", () => socket.write(data));
    let received = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      received += chunk;
    });
    socket.on("error", reject);
    socket.on("close", () => resolve(received));
  });
}

/** Splits HTTP/1.1 responses sent one after the other (each with a Content-Length). */
function responses(text: string): { status: number; headers: Map<string, string>; body: string }[] {
  const out = [];
  let rest = text;
  while (rest.length > 0) {
    const end = rest.indexOf("\r\n\r\n");
    if (end === -1) throw new Error(`an incomplete response: ${rest}`);
    const [statusLine = "", ...lines] = rest.slice(0, end).split("\r\n");
    const headers = new Map(
      lines.map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]),
    );
    const length = Number(headers.get("content-length") ?? 0);
    out.push({
      status: Number(statusLine.split(" ")[1]),
      headers,
      body: rest.slice(end + 4, end + 4 + length),
    });
    rest = rest.slice(end + 4 + length);
  }
  return out;
}

describe("a request Node cannot parse, pipelined after valid requests", () => {
  it("is answered 400 with the envelope after their responses, then the connection closes", async () => {
    const body = JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 1 });
    const text = await exchange(
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" +
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
        `Content-Length: ${body.length}\r\n\r\n${body}` +
        "NOT HTTP AT ALL\r\n\r\n",
    );
    const [health, completion, refusal, ...more] = responses(text);
    expect(more).toEqual([]);
    expect(health?.status).toBe(200);
    expect(JSON.parse(health?.body ?? "")).toEqual({ status: "ok" });
    expect(completion?.status).toBe(200);
    expect(JSON.parse(completion?.body ?? "")).toMatchObject({ object: "text_completion", model: "tiny" });
    expect(refusal?.status).toBe(400);
    expect(refusal?.headers.get("connection")).toBe("close");
    const envelope = JSON.parse(refusal?.body ?? "") as {
      error: Record<string, unknown>;
      request_id: string;
    };
    expect(envelope.error).toMatchObject({
      type: "invalid_request_error",
      code: "invalid_request",
      param: null,
    });
    expect(envelope.request_id).toBe(refusal?.headers.get("x-request-id"));
  });
});

describe("a request with more than ten text prompts", () => {
  it("prints no MaxListenersExceededWarning", async () => {
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on("warning", onWarning);
    try {
      const tag = randomUUID(); // prompts not yet in the /tokenize cache: twelve concurrent calls
      const res = await checkedFetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "tiny",
          prompt: Array.from({ length: 12 }, (_, i) => `${tag} ${i}`),
          max_tokens: 1,
        }),
      });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { choices: unknown[] }).choices).toHaveLength(12);
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on next tick
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings.map((w) => `${w.name}: ${w.message}`)).toEqual([]);
  });
});

describe("errors before routing keep the envelope", () => {
  it("a malformed URL", async () => {
    const res = await checkedFetch(`${stack.url}/v1/models/%zz`);
    expect(res.status).toBe(400);
    const json = (await res.json()) as { error: Record<string, unknown>; request_id: string };
    expect(json.error).toMatchObject({ type: "invalid_request_error", code: "invalid_request", param: null });
    expect(json.request_id).toBe(res.headers.get("x-request-id"));
  });

  it("a CORS preflight on a Connect route carries X-Request-Id", async () => {
    const res = await checkedFetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
      method: "OPTIONS",
      headers: { origin: "http://example.test", "access-control-request-method": "POST" },
    });
    expect(res.status).toBeLessThan(300);
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("an OPTIONS without Origin is not a plain-text failure", async () => {
    const res = await checkedFetch(`${stack.url}/v1/completions`, { method: "OPTIONS" });
    expect(res.headers.get("content-type") ?? "").not.toMatch(/text\/plain/);
    expect(res.status).toBeLessThan(300);
  });

  it("413 carries CORS headers so a browser can read it", async () => {
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", origin: "http://example.test" },
      body: "x".repeat(8 * 1024 * 1024 + 1),
    });
    expect(res.status).toBe(413);
    expect(res.headers.get("access-control-allow-origin")).toBe("http://example.test");
  });

  it("an SSE response carries the CORS headers and X-Request-Id (its events bypass fastify's send)", async () => {
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        origin: "http://example.test",
      },
      body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 2, stream: true }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    expect(res.headers.get("cache-control")).toBe("no-cache");
    expect(res.headers.get("x-accel-buffering")).toBe("no");
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
    expect(res.headers.get("access-control-allow-origin")).toBe("http://example.test");
    // What a browser caller may read: the id, the clamp and a refusal's retry advice too.
    expect(res.headers.get("access-control-expose-headers")?.split(", ")).toEqual(
      expect.arrayContaining(["x-request-id", "x-acs-max-tokens-clamped", "retry-after", "x-should-retry"]),
    );
    expect((await res.text()).endsWith("data: [DONE]\n\n")).toBe(true);
  });
});

describe("413 on the Connect surfaces, with the envelope (bodies that declare their length)", () => {
  const request = create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: { case: "text", value: "x".repeat(8 * 1024 * 1024 + 10) },
    maxTokens: 1,
  });
  const binary = toBinary(CreateCompletionRequestSchema, request);
  const json = JSON.stringify(toJson(CreateCompletionRequestSchema, request));
  const path = "/acs.v1.CompletionsService/CreateCompletion";

  function expectEnvelope(err: ConnectError | undefined) {
    expect(err?.code).toBe(Code.ResourceExhausted);
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0];
    expect(envelope?.error?.code).toBe("request_too_large");
    expect(envelope?.requestId).toMatch(/^req_[0-9a-f]{32}$/);
  }

  it("Connect unary (JSON): HTTP 413 with the Connect error body", async () => {
    const res = await checkedFetch(`${stack.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: json,
    });
    expect(res.status).toBe(413);
    const bytes = new Uint8Array(await res.arrayBuffer());
    expectEnvelope(errorFromJsonBytes(bytes, undefined, new ConnectError("not a Connect error")));
  });

  it("Connect streaming: the end-of-stream message", async () => {
    const res = await checkedFetch(`${stack.url}/acs.v1.CompletionsService/StreamCompletion`, {
      method: "POST",
      headers: { "content-type": "application/connect+proto" },
      body: encodeEnvelope(0, binary),
    });
    expect(res.status).toBe(200);
    const bytes = new Uint8Array(await res.arrayBuffer());
    expect(bytes[0]).toBe(endStreamFlag);
    expectEnvelope(endStreamFromJson(bytes.subarray(5)).error);
  });

  it("gRPC-Web: a trailer frame", async () => {
    const res = await checkedFetch(`${stack.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/grpc-web+proto" },
      body: encodeEnvelope(0, binary),
    });
    expect(res.status).toBe(200);
    const bytes = new Uint8Array(await res.arrayBuffer());
    expect(bytes[0]).toBe(trailerFlag);
    expectEnvelope(findTrailerError(trailerParse(bytes.subarray(5))));
  });

  it("gRPC (h2c): trailers-only headers", async () => {
    const session = http2.connect(stack.url);
    try {
      const headers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
        const body = encodeEnvelope(0, binary);
        const req = session.request({
          ":method": "POST",
          ":path": path,
          "content-type": "application/grpc+proto",
          "content-length": String(body.length),
          te: "trailers",
        });
        req.on("response", resolve);
        req.on("error", reject);
        req.end(body);
      });
      const h = new Headers();
      for (const [k, v] of Object.entries(headers))
        if (!k.startsWith(":") && typeof v === "string") h.set(k, v);
      expectEnvelope(findTrailerError(h));
    } finally {
      session.destroy();
    }
  });
});

describe("Connect JSON is strict", () => {
  it("an unknown field is refused", async () => {
    const res = await checkedFetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", text: "Hi", max_tokens: 1, apply_hooks: "x" }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { code: string }).code).toBe("invalid_argument");
    // refused by connect-es before our handler, and still named
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
  });
});
