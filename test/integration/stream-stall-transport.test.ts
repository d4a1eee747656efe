// A stream ended for a caller that stopped reading really ends its transport, whatever the
// protocol: over HTTP/1.1 (Connect, gRPC-Web, REST SSE) the gateway closes the connection while
// the caller still does not read, and the bytes it had sent stop short of the stream's end; over
// HTTP/2 (gRPC, Connect) the stream is reset with RST_STREAM CANCEL while the session's other
// streams go on and new ones are served. Each RPC's handler ends too (connect-node is not left
// waiting for a 'drain' that never comes, the service's generator suspended at its yield), and the
// access log counts the call as canceled, never as complete.
import http2 from "node:http2";
import net from "node:net";
import {
  afterAll,
  afterEach,
  beforeAll,
  beforeEach,
  describe,
  expect,
  it,
  type MockInstance,
  vi,
} from "vitest";
import { createLifecycle, type Lifecycle } from "../../src/app/index.js";
import { createLogger } from "../../src/telemetry/index.js";
import { until } from "../helpers/hang-guard.js";
import { frame, frames } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import {
  chunk,
  drainedOrClosed,
  type FakeUpstream,
  sse,
  startFakeUpstream,
  withVllmOps,
} from "../upstream/fake-upstream.js";

const MAX_MODEL_LEN = 100_000;
const STALL_MS = 200;
const FLOOD_TEXT = "x".repeat(16 * 1024);
const PATH = "/acs.v1.CompletionsService/StreamCompletion";

/**
 * Inference: a token per character. "flood": 16 KiB chunks as fast as the gateway takes them,
 * until it closes the request. "hold": a chunk "first", then, once `release()` is called, a chunk
 * "second" and the end. Any other prompt: one token "ok" and the end.
 */
interface StallInference extends FakeUpstream {
  readonly floods: { open: number; aborted: number };
  release(): void;
}

async function stallInference(): Promise<StallInference> {
  const floods = { open: 0, aborted: 0 };
  let release = () => {};
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  const event = (text: string) => sse([chunk(0, text, null, { token_ids: [1] })], false);
  const end = (n: number, completion: number) =>
    sse([
      {
        ...chunk(0, ""),
        choices: [],
        usage: { prompt_tokens: n, completion_tokens: completion, total_tokens: n + completion },
      },
    ]);
  const upstream = await startFakeUpstream(
    withVllmOps(
      async (req, res, body) => {
        const json = JSON.parse(body) as { prompt: string };
        const n = json.prompt.length;
        if (req.url === "/tokenize") {
          res.setHeader("content-type", "application/json");
          const tokens = [...json.prompt].map(() => 1);
          res.end(JSON.stringify({ count: tokens.length, max_model_len: MAX_MODEL_LEN, tokens }));
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        if (json.prompt === "hold") {
          res.write(event("first"));
          await released;
          res.end(`${event("second")}${end(n, 2)}`);
          return;
        }
        if (json.prompt !== "flood") {
          res.end(`${event("ok")}${end(n, 1)}`);
          return;
        }
        floods.open++;
        res.on("close", () => {
          floods.open--;
          if (!res.writableFinished) floods.aborted++;
        });
        while (!res.destroyed) {
          if (!res.write(event(FLOOD_TEXT))) await drainedOrClosed(res);
        }
      },
      "acs/fake",
      MAX_MODEL_LEN,
    ),
  );
  return Object.assign(upstream, { floods, release: () => release() });
}

/**
 * A guard far above the STALL_MS everything here waits on (not a time limit: it makes a wait for
 * what never comes fail with its name instead of the hang guard's timeout).
 */
const NEVER_MS = 60_000;

/** Resolves when `emitter` emits `event`; rejects naming `what` after {@link NEVER_MS}. */
function eventually(emitter: NodeJS.EventEmitter, event: string, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const guard = setTimeout(() => reject(new Error(`never happened: ${what}`)), NEVER_MS);
    emitter.once(event, () => {
      clearTimeout(guard);
      resolve();
    });
  });
}

let upstream: StallInference;
let stack: Stack;
let lifecycle: Lifecycle;
/** The gateway's log lines. */
const lines: Array<Record<string, unknown>> = [];
/** The gateway's side of each TCP connection, by the caller's port. */
const serverSockets = new Map<number, net.Socket>();
const cleanup: Array<() => void> = [];

beforeAll(async () => {
  upstream = await stallInference();
  lifecycle = createLifecycle();
  stack = await startStack({
    upstreamUrl: upstream.url,
    model: { maxModelLen: MAX_MODEL_LEN },
    streamStallMs: STALL_MS,
    lifecycle,
    logger: createLogger({
      level: "info",
      format: "json",
      destination: { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) },
    }),
  });
  stack.server.on("connection", (socket: net.Socket) => {
    if (socket.remotePort !== undefined) serverSockets.set(socket.remotePort, socket);
  });
});
// connect-fastify prints an RPC whose response write failed other than as `aborted` (e.g. Node 22's
// ECANCELED for a write its connection's end cancelled): a stall is no such failure.
let printed: MockInstance<typeof console.error>;
beforeEach(() => {
  printed = vi.spyOn(console, "error");
});
afterEach(() => {
  const failures = printed.mock.calls.filter((args) => String(args[0]).startsWith("handler for rpc"));
  printed.mockRestore();
  expect(failures).toEqual([]);
});
afterAll(async () => {
  for (const c of cleanup) c();
  upstream.release();
  await stack.close();
  await upstream.close();
});

/** The access line of the request with id `id`, once it is written. */
async function accessLine(id: unknown): Promise<Record<string, unknown>> {
  if (typeof id !== "string") throw new Error(`no request id: ${String(id)}`);
  const find = () => lines.find((l) => l.msg === "request" && l.requestId === id);
  await until(() => find() !== undefined, `the access line of ${id}`);
  return find() as Record<string, unknown>;
}

const encode = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
const rpcBody = (text: string) => frame(encode({ model: "tiny", text, maxTokens: 30_000 }));

describe("a stalled stream over HTTP/1.1", () => {
  it.each([
    {
      surface: "Connect",
      path: PATH,
      contentType: "application/connect+json",
      body: rpcBody("flood"),
    },
    {
      surface: "gRPC-Web",
      path: PATH,
      contentType: "application/grpc-web+json",
      body: rpcBody("flood"),
    },
    {
      surface: "REST SSE",
      path: "/v1/completions",
      contentType: "application/json",
      body: encode({ model: "tiny", prompt: "flood", max_tokens: 30_000, stream: true }),
    },
  ])("$surface: the gateway closes the connection of a caller that never reads", async (c) => {
    const abortedBefore = upstream.floods.aborted;
    const openBefore = lifecycle.link.openCalls;
    const socket = net.connect(Number(new URL(stack.url).port), "127.0.0.1");
    cleanup.push(() => socket.destroy());
    socket.on("error", () => {});
    socket.pause();
    await eventually(socket, "connect", "the caller connected");
    const head = `POST ${c.path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: ${c.contentType}\r\ncontent-length: ${c.body.length}\r\n\r\n`;
    socket.write(head);
    socket.write(c.body);
    // The caller reads nothing: once its connection's buffers are full, the stream stalls and the
    // gateway closes its side of the connection.
    await until(() => serverSockets.has(socket.localPort ?? -1), "the gateway accepted the connection");
    const serverSide = serverSockets.get(socket.localPort ?? -1) as net.Socket;
    await eventually(
      serverSide,
      "close",
      `the gateway closed the connection of its stalled ${c.surface} caller`,
    );
    expect(upstream.floods.aborted).toBe(abortedBefore + 1);

    // The caller reads at last: the response stops short — no end of the chunked body, no end of
    // the stream (Connect end-stream message, gRPC-Web trailers, SSE [DONE]) — then the close.
    let text = "";
    socket.on("data", (b: Buffer) => {
      text += b.toString("latin1");
    });
    const closed = eventually(socket, "close", "the caller saw its connection closed");
    socket.resume();
    await closed;
    expect(text.startsWith("HTTP/1.1 200")).toBe(true);
    expect(text.length).toBeGreaterThan(FLOOD_TEXT.length);
    expect(text.endsWith("\r\n0\r\n\r\n")).toBe(false);
    expect(text).not.toContain("data: [DONE]");
    expect(text).not.toContain("grpc-status:");
    const line = await accessLine(/^x-request-id: (\S+)\r$/im.exec(text)?.[1]);
    expect(line).toMatchObject(
      c.surface === "REST SSE" ? { status: 499, canceled: true } : { grpcCode: "canceled", canceled: true },
    );
    // The call's handler has ended: for an RPC, connect-node is not left waiting for a 'drain'
    // with the service's generator suspended (REST calls end at their response's close).
    await until(() => lifecycle.link.openCalls === openBefore, `the ${c.surface} call's handler ended`);
  });
});

describe("a stalled stream over HTTP/2", () => {
  it("is reset (RST_STREAM CANCEL) while the session's other streams go on", async () => {
    const session = http2.connect(stack.url);
    cleanup.push(() => session.destroy());
    session.on("error", () => {});
    /** A call on `session`: what it received, and its end (trailers, reset code). */
    const call = (contentType: string, text: string, read: boolean) => {
      const stream = session.request({
        ":method": "POST",
        ":path": PATH,
        "content-type": contentType,
        te: "trailers",
      });
      stream.on("error", () => {});
      const got = {
        data: [] as Buffer[],
        headers: undefined as http2.IncomingHttpHeaders | undefined,
        trailers: undefined as http2.IncomingHttpHeaders | undefined,
      };
      stream.on("response", (h: http2.IncomingHttpHeaders) => {
        got.headers = h;
      });
      stream.on("trailers", (t: http2.IncomingHttpHeaders) => {
        got.trailers = t;
      });
      if (read) stream.on("data", (b: Buffer) => got.data.push(b));
      else stream.pause();
      const closed = eventually(stream, "close", `the ${contentType} stream "${text}" closed`);
      closed.catch(() => {}); // awaited below; not an unhandled rejection if an earlier step fails
      stream.end(rpcBody(text));
      return { stream, got, closed };
    };
    const abortedBefore = upstream.floods.aborted;
    const openBefore = lifecycle.link.openCalls;

    // A stream that is read, and has its first chunk, before the others stall.
    const held = call("application/grpc+json", "hold", true);
    await until(() => held.got.data.length > 0, "the held stream's first chunk");
    // Two streams on the same session whose caller reads nothing (gRPC and Connect).
    const stalled = [
      call("application/grpc+json", "flood", false),
      call("application/connect+json", "flood", false),
    ];
    for (const s of stalled) await s.closed;
    for (const s of stalled) {
      expect(s.stream.rstCode).toBe(http2.constants.NGHTTP2_CANCEL);
      expect(s.got.trailers).toBeUndefined();
      const line = await accessLine(s.got.headers?.["x-request-id"]);
      expect(line).toMatchObject({ grpcCode: "canceled", canceled: true });
    }
    expect(upstream.floods.aborted).toBe(abortedBefore + 2);
    expect(session.closed || session.destroyed).toBe(false);

    // The held stream goes on to its end; a new stream on the same session is served.
    upstream.release();
    await held.closed;
    expect(held.stream.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
    expect(held.got.trailers?.["grpc-status"]).toBe("0");
    const heldText = frames(Buffer.concat(held.got.data)).map((f) => f.data.toString("utf8"));
    expect(heldText.join("")).toContain("first");
    expect(heldText.join("")).toContain("second");
    const probe = call("application/grpc+json", "probe", true);
    await probe.closed;
    expect(probe.got.trailers?.["grpc-status"]).toBe("0");
    expect(Buffer.concat(probe.got.data).toString("utf8")).toContain('"ok"');

    // Every RPC's handler has ended (connect-node is not left waiting for a 'drain').
    await until(() => lifecycle.link.openCalls === openBefore, "every call's handler ended");
    session.close();
  });
});
