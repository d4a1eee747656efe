// The edges of the one-port server: slow and silent connections are cut off, errors raised before
// routing keep the envelope, 413 on every surface (Connect, gRPC and gRPC-Web included) carries
// the envelope, and Connect JSON is strict about unknown fields.
import { once } from "node:events";
import http2 from "node:http2";
import net from "node:net";
import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { endStreamFlag, endStreamFromJson, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack({ timeouts: { firstBytesMs: 300, headersMs: 400, requestMs: 600 } });
});
afterAll(async () => {
  await stack.close();
});

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
  const client = net.connect(Number(new URL(stack.url).port), "127.0.0.1", () => {
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
});

describe("errors before routing keep the envelope", () => {
  it("a malformed URL", async () => {
    const res = await fetch(`${stack.url}/v1/models/%zz`);
    expect(res.status).toBe(400);
    const json = (await res.json()) as { error: Record<string, unknown>; request_id: string };
    expect(json.error).toMatchObject({ type: "invalid_request_error", code: "invalid_request", param: null });
    expect(json.request_id).toBe(res.headers.get("x-request-id"));
  });

  it("a CORS preflight on a Connect route carries X-Request-Id", async () => {
    const res = await fetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
      method: "OPTIONS",
      headers: { origin: "http://example.test", "access-control-request-method": "POST" },
    });
    expect(res.status).toBeLessThan(300);
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it("an OPTIONS without Origin is not a plain-text failure", async () => {
    const res = await fetch(`${stack.url}/v1/completions`, { method: "OPTIONS" });
    expect(res.headers.get("content-type") ?? "").not.toMatch(/text\/plain/);
    expect(res.status).toBeLessThan(300);
  });

  it("413 carries CORS headers so a browser can read it", async () => {
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", origin: "http://example.test" },
      body: "x".repeat(8 * 1024 * 1024 + 1),
    });
    expect(res.status).toBe(413);
    expect(res.headers.get("access-control-allow-origin")).toBe("http://example.test");
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
    const res = await fetch(`${stack.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: json,
    });
    expect(res.status).toBe(413);
    const bytes = new Uint8Array(await res.arrayBuffer());
    expectEnvelope(errorFromJsonBytes(bytes, undefined, new ConnectError("not a Connect error")));
  });

  it("Connect streaming: the end-of-stream message", async () => {
    const res = await fetch(`${stack.url}/acs.v1.CompletionsService/StreamCompletion`, {
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
    const res = await fetch(`${stack.url}${path}`, {
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
    const res = await fetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
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
