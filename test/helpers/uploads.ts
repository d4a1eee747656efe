// Clients that upload a body and read the answer at the socket level: HTTP/1.1 (raw net, chunked)
// and HTTP/2 (node:http2), each resolving once the server has closed the connection or stream.
import http2 from "node:http2";
import net from "node:net";
import { until } from "./hang-guard.js";

const SLICE = 64 * 1024;

export interface H1Result {
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
export function h1Upload(
  baseUrl: string,
  path: string,
  headers: Record<string, string>,
  body: Buffer,
  opts: { end?: boolean; untilAnswer?: (received: Buffer) => boolean } = {},
): Promise<H1Result> {
  const url = new URL(baseUrl);
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

export interface H2Result {
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
export function h2Upload(
  baseUrl: string,
  headers: http2.OutgoingHttpHeaders,
  body: Buffer,
  opts: { end?: boolean; untilAnswer?: (received: Buffer) => boolean } = {},
): Promise<H2Result> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(baseUrl);
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
