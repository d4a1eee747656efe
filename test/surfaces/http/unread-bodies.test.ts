// The one-port server's rule for a response sent before its request's body was read to the end
// (src/surfaces/http/unread-bodies.ts), with an app that reads the first piece of a body, stops reading
// (neither drains nor destroys the request) and answers: the case Node leaves to the app on both
// protocols. The client writes its whole body before it looks at the answer. LIVENESS_MS is a
// liveness bound, far above what the exchange takes; the server's close grace is longer still, so
// a connection ends because the client closed it, not because the grace ran out.
import type http from "node:http";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createOnePortServer,
  defaultOnePortTimeouts,
  type OnePortServer,
} from "../../../src/surfaces/http/one-port-server.js";
import { h1Upload, h2Upload } from "../../helpers/uploads.js";

const LIVENESS_MS = 20_000;
const BODY = Buffer.alloc(32 * 1024 * 1024, 0x61);

let server: OnePortServer;
let url: string;

/** Reads one chunk, then stops reading and answers 413. */
function answerAfterFirstChunk(
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
): void {
  req.once("data", () => {
    req.pause();
    res.statusCode = 413;
    res.end("too large");
  });
}

beforeAll(async () => {
  server = createOnePortServer(answerAfterFirstChunk, { ...defaultOnePortTimeouts, closeGraceMs: 120_000 });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

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

describe("an app that stops reading a body and answers", () => {
  it("HTTP/1.1: Connection: close, the rest of the body read and dropped, then the connection closed", async () => {
    const res = await within(h1Upload(url, "/", {}, BODY), "the connection to close after the answer");
    expect(res.head.split(" ", 2)[1]).toBe("413");
    expect(res.head.toLowerCase()).toContain("\r\nconnection: close");
    expect(res.body.toString()).toContain("too large");
    expect(res.sentAll).toBe(true);
  });

  it("HTTP/2: the stream reset with NO_ERROR after the answer", async () => {
    const res = await within(h2Upload(url, { ":path": "/" }, BODY), "the stream to close after the answer");
    expect(res.status).toBe(413);
    expect(res.body.toString()).toBe("too large");
    expect(res.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
  });
});
