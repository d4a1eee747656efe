import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { Duplex } from "node:stream";

/** The HTTP/2 connection preface a prior-knowledge (h2c) client sends first. */
const h2Preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

type Handler = (
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
) => void;

/** A net.Server that fastify can listen on and close, serving HTTP/1.1 and h2c on one port. */
export type OnePortServer = net.Server & {
  /** Closes idle HTTP/1.1 connections and asks HTTP/2 sessions to finish (GOAWAY). */
  closeIdleConnections(): void;
  /** Destroys every connection at once. */
  closeAllConnections(): void;
};

/** Connection timeouts, ms: a client that sends too slowly or holds idle connections is cut off. */
export interface OnePortTimeouts {
  /** The first bytes of a connection (to tell HTTP/1.1 from h2c). @default 10000 */
  readonly firstBytesMs: number;
  /** HTTP/1.1: all request headers (Node's headersTimeout). @default 60000 */
  readonly headersMs: number;
  /** HTTP/1.1: the whole request, body included (Node's requestTimeout). @default 300000 */
  readonly requestMs: number;
  /** HTTP/1.1 keep-alive between requests. @default 5000 */
  readonly keepAliveMs: number;
  /** HTTP/2: a session with no frames for this long is closed gracefully (open streams finish). @default 72000 */
  readonly h2IdleMs: number;
}

export const defaultOnePortTimeouts: OnePortTimeouts = {
  firstBytesMs: 10_000,
  headersMs: 60_000,
  requestMs: 300_000,
  keepAliveMs: 5_000,
  h2IdleMs: 72_000,
};

/**
 * A fastify `serverFactory` serving HTTP/1.1 and cleartext HTTP/2 (prior knowledge, what gRPC
 * clients send) on the same port: each connection's first bytes are compared with the HTTP/2
 * preface and the connection goes to an http or an http2 server accordingly. Bytes read while
 * deciding are replayed: pushed back onto the socket for HTTP/1.1, and fed through a JS Duplex for
 * HTTP/2 (http2 would otherwise read the native handle and miss them). See TOOLCHAIN.md.
 */
export function createOnePortServer(
  handler: Handler,
  timeouts: OnePortTimeouts = defaultOnePortTimeouts,
): OnePortServer {
  const h1 = http.createServer(
    {
      headersTimeout: timeouts.headersMs,
      requestTimeout: timeouts.requestMs,
      keepAliveTimeout: timeouts.keepAliveMs,
      // how often Node checks headersTimeout/requestTimeout
      connectionsCheckingInterval: Math.max(10, Math.min(30_000, Math.floor(timeouts.headersMs / 4))),
    },
    handler as http.RequestListener,
  );
  const h2 = http2.createServer(
    {},
    handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (session) => {
    session.setTimeout(timeouts.h2IdleMs, () => session.close());
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  const sockets = new Set<net.Socket>();

  const toHttp2 = (socket: net.Socket, head: Buffer) => {
    const duplex = new Duplex({
      read() {
        socket.resume();
      },
      write(chunk, encoding, callback) {
        socket.write(chunk, encoding, callback);
      },
      final(callback) {
        socket.end(callback);
      },
      destroy(err, callback) {
        socket.destroy(err ?? undefined);
        callback(err);
      },
    });
    duplex.push(head);
    socket.on("data", (data: Buffer) => {
      if (!duplex.push(data)) socket.pause();
    });
    socket.on("end", () => duplex.push(null));
    socket.on("error", (err) => duplex.destroy(err));
    socket.on("close", () => duplex.destroy());
    h2.emit("connection", duplex);
  };

  const server = net.createServer((socket) => {
    // Small writes (SSE chunks, unary replies) must not wait for Nagle + delayed ACK (~40 ms).
    socket.setNoDelay(true);
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.setTimeout(timeouts.firstBytesMs, () => socket.destroy());
    let head = Buffer.alloc(0);
    const onData = (data: Buffer) => {
      head = Buffer.concat([head, data]);
      const n = Math.min(head.length, h2Preface.length);
      const isPrefix = head.subarray(0, n).equals(h2Preface.subarray(0, n));
      if (isPrefix && head.length < h2Preface.length) return; // need more bytes to decide
      socket.off("data", onData);
      socket.setTimeout(0);
      socket.pause();
      if (isPrefix) {
        toHttp2(socket, head);
      } else {
        socket.unshift(head);
        h1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", onData);
    socket.on("error", () => socket.destroy());
  }) as OnePortServer;

  server.closeIdleConnections = () => {
    h1.closeIdleConnections();
    for (const s of sessions) s.close();
  };
  server.closeAllConnections = () => {
    for (const s of sessions) s.destroy();
    for (const socket of sockets) socket.destroy();
  };
  // The http server tracks its connections' timeouts from its 'listening' event; it never listens
  // itself (connections are handed to it), so start the tracking with the real listener.
  server.on("listening", () => h1.emit("listening"));
  server.on("close", () => {
    h1.close();
    h2.close();
  });
  return server;
}
