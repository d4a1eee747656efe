// A request whose body the gateway will not read (over the 8 MiB cap, sent without a length, so
// no check before routing can refuse it) gets its answer and then its connection closed —
// HTTP/1.1: `Connection: close` and the socket ended; HTTP/2: the stream reset with NO_ERROR —
// on every surface, for a client that writes its whole body before it reads. Before the fix a
// gRPC-Web or Connect streaming upload waited on a socket the gateway had stopped reading until
// the keep-alive timeout (~66 s) reset it. Each exchange is bounded by LIVENESS_MS, a liveness
// bound far below the 65 s keep-alive, far above what the exchange takes on a busy machine.
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { limits } from "../../src/config/index.js";
import { frame } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { h1Upload, h2Upload } from "../helpers/uploads.js";

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
      h1Upload(stack.url, s.path, { "content-type": s.contentType }, s.body()),
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
      h2Upload(stack.url, { ":path": s.path, "content-type": s.contentType, te: "trailers" }, s.body()),
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
      h1Upload(stack.url, rpc("StreamCompletion"), { "content-type": "application/connect+proto" }, body, {
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
      h2Upload(
        stack.url,
        { ":path": rpc("StreamCompletion"), "content-type": "application/connect+proto" },
        body,
        {
          end: false,
          untilAnswer: (received) => stopsAt(received.toString("latin1")),
        },
      ),
      "the in-band resource_exhausted while the body is still open",
    );
    expect(res.status).toBe(200);
  });
});
