// A request whose body the gateway will not read (over the 8 MiB cap, sent without a length, so
// no check before routing can refuse it) gets its answer and then its connection closed —
// HTTP/1.1: `Connection: close` and the socket ended; HTTP/2: the stream reset with NO_ERROR —
// on every surface, for a client that writes its whole body before it reads. Before the fix a
// gRPC-Web or Connect streaming upload waited on a socket the gateway had stopped reading until
// the keep-alive timeout (~66 s) reset it. Each exchange is bounded by LIVENESS_MS, a liveness
// bound far below the 65 s keep-alive, far above what the exchange takes on a busy machine.
import http2 from "node:http2";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { limits } from "../../src/config/index.js";
import { until } from "../helpers/hang-guard.js";
import { frame } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const LIVENESS_MS = 20_000;
const OVER = limits.bodyLimitBytes + 1024 * 1024;
const SLICE = 64 * 1024;

let stack: Stack;
beforeAll(async () => {
  // A lingering close far longer than LIVENESS_MS: the connection must end because the client
  // closed it, having sent its body and read the answer, not because the grace ran out.
  stack = await startStack({ timeouts: { closeGraceMs: 120_000 } });
});
afterAll(async () => {
  await stack.close();
});

/** Rejects with `what` when `p` has not settled within LIVENESS_MS. */
function within<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`still waiting after ${LIVENESS_MS} ms: ${what}`)),
      LIVENESS_MS,
    );
  });
  return Promise.race([p, bound]).finally(() => clearTimeout(timer));
}

/** A JSON body over the cap (REST and Connect JSON). */
function bigJson(): Buffer {
  return Buffer.from(`{"model": "tiny", "prompt": "${"a".repeat(OVER)}"}`);
}

/** One enveloped message over the cap (gRPC, gRPC-Web, Connect streaming). */
function bigFrame(): Buffer {
  return Buffer.from(frame(new Uint8Array(OVER)));
}

interface H1Result {
  readonly head: string;
  readonly body: Buffer;
  /** Every byte of the request, the last chunk too, was written before the connection ended. */
  readonly sentAll: boolean;
}

/**
 * Writes an HTTP/1.1 request with a chunked body — all of it, then the last chunk — and resolves
 * once the server has closed the connection, with what it answered. `end: false` sends `body` but
 * never the last chunk (the answer must come without it).
 */
function h1Upload(
  path: string,
  headers: Record<string, string>,
  body: Buffer,
  opts: { end?: boolean; untilAnswer?: (received: Buffer) => boolean } = {},
): Promise<H1Result> {
  const url = new URL(stack.url);
  return new Promise((resolve, reject) => {
    // Half-open allowed: the client goes on sending after the server's FIN, as one that writes its
    // whole body before it looks at the answer does, and then closes its side.
    const socket = net.connect({ port: Number(url.port), host: url.hostname, allowHalfOpen: true });
    const received: Buffer[] = [];
    let sentAll = false;
    const result = (): H1Result => {
      const all = Buffer.concat(received);
      const split = all.indexOf("\r\n\r\n");
      return { head: all.subarray(0, split).toString("latin1"), body: all.subarray(split + 4), sentAll };
    };
    socket.on("data", (d: Buffer) => {
      received.push(d);
      if (opts.untilAnswer?.(Buffer.concat(received))) {
        resolve(result());
        socket.destroy();
      }
    });
    // Writes the server refuses once it has closed (EPIPE, ECONNRESET) end the upload, not the test.
    socket.on("error", () => {});
    socket.on("close", () => (received.length > 0 ? resolve(result()) : reject(new Error("no answer"))));
    const lines = Object.entries({ host: url.host, "transfer-encoding": "chunked", ...headers }).map(
      ([k, v]) => `${k}: ${v}\r\n`,
    );
    void (async () => {
      let failed = false;
      const write = (data: string | Buffer) =>
        new Promise<void>((done) => {
          if (socket.destroyed || !socket.writable) {
            failed = true;
            return done();
          }
          socket.write(data, (err) => {
            if (err) failed = true;
            done();
          });
        });
      await write(`POST ${path} HTTP/1.1\r\n${lines.join("")}\r\n`);
      for (let at = 0; at < body.length; at += SLICE) {
        const slice = body.subarray(at, at + SLICE);
        await write(`${slice.length.toString(16)}\r\n`);
        await write(slice);
        await write("\r\n");
      }
      if (opts.end !== false) await write("0\r\n\r\n");
      sentAll = !failed;
      if (opts.end !== false) socket.end();
    })();
  });
}

interface H2Result {
  readonly status: number;
  readonly headers: http2.IncomingHttpHeaders;
  readonly body: Buffer;
  readonly trailers: http2.IncomingHttpHeaders;
  readonly rstCode: number;
}

/**
 * Sends an HTTP/2 request whose body is `body` in DATA frames, all of it then END_STREAM, and
 * resolves once the answer has ended and the stream is closed both ways (its END_STREAM, or the
 * server's RST_STREAM: a client stops sending then, keeping the answer), with what the server
 * answered and the RST code. `end: false` never ends the body; `untilAnswer` resolves as soon as
 * the answer holds.
 */
function h2Upload(
  headers: http2.OutgoingHttpHeaders,
  body: Buffer,
  opts: { end?: boolean; untilAnswer?: (received: Buffer) => boolean } = {},
): Promise<H2Result> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(stack.url);
    session.on("error", reject);
    const stream = session.request({ ":method": "POST", ...headers });
    let status = 0;
    let responseHeaders: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    const finish = (): void => {
      resolve({
        status,
        headers: responseHeaders,
        body: Buffer.concat(chunks),
        trailers,
        rstCode: stream.rstCode ?? -1,
      });
      session.destroy();
    };
    stream.on("response", (h) => {
      status = Number(h[":status"]);
      responseHeaders = h;
    });
    stream.on("trailers", (t) => {
      trailers = t;
    });
    stream.on("data", (c: Buffer) => {
      chunks.push(c);
      if (opts.untilAnswer?.(Buffer.concat(chunks))) finish();
    });
    stream.on("error", () => {});
    // Node keeps a stream reset with NO_ERROR open while its body has not all been written: the
    // answer's end, then the reset (rstCode set), is where a client stops.
    stream.on("end", () => {
      void until(() => stream.rstCode !== undefined, "the stream closed after its answer").then(finish);
    });
    void (async () => {
      for (let at = 0; at < body.length; at += SLICE) {
        if (stream.destroyed || stream.closed) return;
        if (!stream.write(body.subarray(at, at + SLICE))) {
          await new Promise((r) => {
            stream.once("drain", r);
            stream.once("close", r);
            stream.once("end", r);
          });
        }
      }
      if (opts.end !== false && !stream.destroyed && !stream.closed) stream.end();
    })();
  });
}

const rpc = (method: string) => `/acs.v1.CompletionsService/${method}`;

interface Surface {
  readonly name: string;
  readonly path: string;
  readonly contentType: string;
  readonly body: () => Buffer;
  /** The refusal as this surface carries it, read from what came back. */
  readonly refused: (status: number, text: string) => boolean;
}

const surfaces: Surface[] = [
  {
    name: "REST /v1/completions",
    path: "/v1/completions",
    contentType: "application/json",
    body: bigJson,
    refused: (status, text) => status === 413 && text.includes('"request_too_large"'),
  },
  {
    name: "Connect JSON",
    path: rpc("CreateCompletion"),
    contentType: "application/json",
    body: bigJson,
    refused: (_status, text) => text.includes('"resource_exhausted"'),
  },
  {
    name: "Connect streaming proto",
    path: rpc("StreamCompletion"),
    contentType: "application/connect+proto",
    body: bigFrame,
    refused: (status, text) => status === 200 && text.includes('"resource_exhausted"'),
  },
  {
    name: "gRPC-Web",
    path: rpc("CreateCompletion"),
    contentType: "application/grpc-web+proto",
    body: bigFrame,
    refused: (status, text) => status === 200 && /grpc-status: ?8\r\n/.test(text),
  },
  {
    name: "unknown route",
    path: "/v1/nope",
    contentType: "application/json",
    body: bigJson,
    refused: (status, text) => status === 413 && text.includes('"request_too_large"'),
  },
];

describe("HTTP/1.1: answered, then Connection: close and the socket ended", () => {
  it.each(surfaces)("$name", async (s) => {
    const res = await within(
      h1Upload(s.path, { "content-type": s.contentType }, s.body()),
      `${s.name}: the connection to close after the answer`,
    );
    const status = Number(res.head.split(" ", 2)[1]);
    expect(
      s.refused(status, res.body.toString("latin1")),
      `${res.head}\n${JSON.stringify(res.body.toString("latin1").slice(0, 400))}`,
    ).toBe(true);
    expect(res.head.toLowerCase()).toContain("\r\nconnection: close");
    // Read to its end and dropped: the client was not cut off while it sent the rest.
    expect(res.sentAll).toBe(true);
  });
});

describe("HTTP/2: answered, then the stream reset with NO_ERROR", () => {
  const h2Surfaces: Surface[] = [
    ...surfaces.filter((s) => s.name !== "gRPC-Web"),
    {
      name: "gRPC",
      path: rpc("CreateCompletion"),
      contentType: "application/grpc+proto",
      body: bigFrame,
      refused: (status) => status === 200,
    },
  ];
  it.each(h2Surfaces)("$name", async (s) => {
    const res = await within(
      h2Upload({ ":path": s.path, "content-type": s.contentType, te: "trailers" }, s.body()),
      `${s.name}: the stream to close after the answer`,
    );
    const text = res.body.toString("latin1");
    if (s.name === "gRPC") expect(res.trailers["grpc-status"] ?? res.headers["grpc-status"]).toBe("8");
    else expect(s.refused(res.status, text), text.slice(0, 200)).toBe(true);
    expect(res.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
  });
});

describe("a streamed upload over the cap gets its in-band error before its body ends", () => {
  const stopsAt = (text: string) => text.includes('"resource_exhausted"');
  it("Connect streaming over HTTP/1.1", async () => {
    const body = bigFrame().subarray(0, limits.bodyLimitBytes + 4 * SLICE);
    const res = await within(
      h1Upload(rpc("StreamCompletion"), { "content-type": "application/connect+proto" }, body, {
        end: false,
        untilAnswer: (received) => stopsAt(received.toString("latin1")),
      }),
      "the in-band resource_exhausted while the body is still open",
    );
    expect(res.head.split(" ", 2)[1]).toBe("200");
  });
  it("Connect streaming over HTTP/2", async () => {
    const body = bigFrame().subarray(0, limits.bodyLimitBytes + 4 * SLICE);
    const res = await within(
      h2Upload({ ":path": rpc("StreamCompletion"), "content-type": "application/connect+proto" }, body, {
        end: false,
        untilAnswer: (received) => stopsAt(received.toString("latin1")),
      }),
      "the in-band resource_exhausted while the body is still open",
    );
    expect(res.status).toBe(200);
  });
});
