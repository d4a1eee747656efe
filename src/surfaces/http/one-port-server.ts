import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { Duplex } from "node:stream";
import { closeWhenBodyUnread } from "./unread-bodies.js";

/** The HTTP/2 connection preface a prior-knowledge (h2c) client sends first. */
const h2Preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

type Handler = (
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
) => void;

/** A net.Server that fastify can listen on and close, serving HTTP/1.1 and h2c on one port. */
export type OnePortServer = net.Server & {
  /**
   * Closes idle HTTP/1.1 connections and asks HTTP/2 sessions to finish (GOAWAY); each is destroyed
   * once its open streams have ended. From then on, each HTTP/1.1 connection is closed once its
   * last response is done, and each new HTTP/2 session is sent GOAWAY at once (fastify's close).
   */
  closeIdleConnections(): void;
  /** Destroys every connection at once. */
  closeAllConnections(): void;
};

/**
 * Connection timeouts, ms: a client that sends too slowly or holds idle connections is cut off.
 * Each is a deadline from the moment named, not an idle timeout, unless it says "idle": bytes
 * dripped slowly do not extend it.
 */
export interface OnePortTimeouts {
  /**
   * Every connection, from its accept: the first bytes that tell HTTP/1.1 from h2c (for h2c the
   * whole 24-byte HTTP/2 preface). A connection still undecided then is destroyed. @default 10000
   */
  readonly firstBytesMs: number;
  /** HTTP/1.1: all request headers (Node's headersTimeout; 408, connection closed). @default 60000 */
  readonly headersMs: number;
  /**
   * The whole request, body included. HTTP/1.1: Node's requestTimeout (408, connection closed).
   * HTTP/2: from a stream's HEADERS to the end of its request body (END_STREAM); a stream whose body
   * has not ended then is reset (RST_STREAM CANCEL) and its session closed gracefully (GOAWAY: the
   * other open streams finish, no new ones start), as HTTP/1.1 closes the connection.
   * @default 300000
   */
  readonly requestMs: number;
  /**
   * HTTP/1.1 keep-alive between requests (idle). Longer than the idle timeout of the load balancers
   * and clients in front (60 s for AWS ALB, nginx's 60 s `keepalive_timeout`; undici 4 s): the side
   * that closes an idle connection first should be the client, else a request sent on it as the
   * server closes it is reset (a 502 at a load balancer, ECONNRESET in a client). @default 65000
   */
  readonly keepAliveMs: number;
  /**
   * HTTP/2, idle: a session whose streams carry nothing (HEADERS or DATA, either way) for this long
   * is closed gracefully (GOAWAY: open streams finish, no new ones start; then it is destroyed).
   * PING, SETTINGS and the bytes of a header block not yet complete do not count (Node's session
   * timeout), so a session sending only those, or a header block dripped slowly while no other
   * stream is open, is closed at this deadline. @default 72000
   */
  readonly h2IdleMs: number;
  /**
   * Once the server has closed its side of a connection (FIN), the time the client has to read the
   * rest and close its own; then the socket is destroyed. HTTP/2: after GOAWAY. HTTP/1.1: after a
   * response sent before its request's body was read (`Connection: close`; the rest of the body is
   * read and dropped meanwhile, src/surfaces/http/unread-bodies.ts). A client that never closes would
   * otherwise hold the connection, and a shutdown, forever. @default 5000
   */
  readonly closeGraceMs: number;
}

export const defaultOnePortTimeouts: OnePortTimeouts = {
  firstBytesMs: 10_000,
  headersMs: 60_000,
  requestMs: 300_000,
  keepAliveMs: 65_000,
  h2IdleMs: 72_000,
  closeGraceMs: 5_000,
};

/**
 * The limits of each HTTP/2 session (explicit rather than Node's defaults):
 * - `maxConcurrentStreams` 128 (a SETTINGS value; Node's default is 2^32 − 1): streams open at once
 *   on one session. Clients queue the rest until a stream closes (nghttp2, gRPC, connect-node).
 * - `maxSessionMemory` 160 (Node's unit, MB): what nghttp2 holds for the session (header tables,
 *   frames and data queued to send, unacknowledged PING/SETTINGS). While above it, new streams are
 *   refused (RST_STREAM ENHANCE_YOUR_CALM) and open ones go on. Node's default of 10 is below one
 *   response with activations (up to 2^25 float32 numbers, 134 MB): the session's other calls
 *   would be refused while such a response drains to a client that reads it slowly.
 * - `maxHeaderListSize` 65535 (a SETTINGS value, Node's default stated): decoded request headers.
 * Node's defaults are kept for the rest: at most 10 unacknowledged PINGs, 100 refused streams and
 * 1000 invalid frames per session before it is closed.
 */
export const h2SessionLimits = {
  maxConcurrentStreams: 128,
  maxSessionMemory: 160,
  maxHeaderListSize: 65_535,
} as const;

/**
 * HTTP/2 header values that start or end with a space or tab (`authorization: Bearer KEY␠`) reach
 * the app as they came, to be read by the same rules as HTTP/1.1, whose parser strips that
 * whitespace (the Authorization rule: src/budget/api-key.ts, `parseAuthorization`). RFC 9113
 * §8.2.1 calls such a request malformed, and nghttp2 drops the field unless told not to: Node's
 * `strictFieldWhitespaceValidation: false` (Node 24.2 and later; a Node without the option
 * ignores it and drops the field, so the call is answered as one without it).
 */
const h2FieldWhitespace = { strictFieldWhitespaceValidation: false } as http2.ServerOptions;

/** One server's parts and the state its connections share (the functions below take it). */
interface OnePort {
  readonly timeouts: OnePortTimeouts;
  readonly h1: http.Server;
  readonly h2: http2.Http2Server;
  /** Open streams per HTTP/2 session. */
  readonly sessions: Map<http2.ServerHttp2Session, { streams: number }>;
  readonly sockets: Set<net.Socket>;
  /**
   * Set by closeIdleConnections() (fastify's close): from then on every connection closes as soon
   * as it is idle — an HTTP/1.1 one after its last response, an HTTP/2 session opened meanwhile at
   * once (GOAWAY: the streams it has go on) — so that calls in flight hold the close, idle
   * keep-alive connections do not.
   */
  closingIdle: boolean;
  /**
   * HTTP/1.1: responses not yet finished per connection (pipelined requests queue theirs), and
   * what to do once they are, so that a request Node cannot parse is answered after the responses
   * to the requests before it rather than in their place.
   */
  readonly unfinished: WeakMap<net.Socket, Set<http.IncomingMessage>>;
  readonly whenFinished: WeakMap<net.Socket, () => void>;
  /** HTTP/1.1 connections whose client error has been answered (Node reports each later chunk again). */
  readonly failed: WeakSet<net.Socket>;
}

/**
 * A fastify `serverFactory` serving HTTP/1.1 and cleartext HTTP/2 (prior knowledge, what gRPC
 * clients send) on the same port: each connection's first bytes are compared with the HTTP/2
 * preface and the connection goes to an http or an http2 server accordingly. Bytes read while
 * deciding are replayed: pushed back onto the socket for HTTP/1.1, and fed through a JS Duplex for
 * HTTP/2 (http2 would otherwise read the native handle and miss them). Why not fastify's own
 * options: `fastify({ http2: true })` refuses HTTP/1.1, and `allowHTTP1` works only with TLS.
 * h2 sockets get `setNoDelay(true)` (else ~130 ms per unary call, Nagle + delayed ACK).
 */
export function createOnePortServer(
  handler: Handler,
  timeouts: OnePortTimeouts = defaultOnePortTimeouts,
): OnePortServer {
  // A response sent before its request's body was read ends the connection (HTTP/1.1) or the
  // stream (HTTP/2) after it, on every route (src/surfaces/http/unread-bodies.ts).
  const serve: Handler = (req, res) => {
    closeWhenBodyUnread(req, res, timeouts.closeGraceMs);
    handler(req, res);
  };
  const port: OnePort = {
    timeouts,
    h1: createH1(timeouts, serve),
    h2: createH2(serve),
    sessions: new Map(),
    sockets: new Set(),
    closingIdle: false,
    unfinished: new WeakMap(),
    whenFinished: new WeakMap(),
    failed: new WeakSet(),
  };
  port.h2.on("session", (session) => trackSession(port, session));
  port.h2.on("stream", (stream: http2.ServerHttp2Stream) => bodyDeadline(port, stream));
  port.h1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) =>
    trackResponse(port, req, res),
  );
  const server = net.createServer((socket) => accept(port, socket)) as OnePortServer;
  port.h1.on("clientError", (err: Error, socket: net.Socket) => onClientError(port, server, err, socket));
  server.closeIdleConnections = () => {
    port.closingIdle = true;
    port.h1.closeIdleConnections();
    for (const s of port.sessions.keys()) closeSession(port, s);
  };
  server.closeAllConnections = () => {
    for (const s of port.sessions.keys()) s.destroy();
    for (const socket of port.sockets) socket.destroy();
  };
  // The http server tracks its connections' timeouts from its 'listening' event; it never listens
  // itself (connections are handed to it), so start the tracking with the real listener.
  server.on("listening", () => port.h1.emit("listening"));
  server.on("close", () => {
    port.h1.close();
    port.h2.close();
  });
  return server;
}

/** The HTTP/1.1 server, under Node's header, request and keep-alive deadlines. */
function createH1(timeouts: OnePortTimeouts, serve: Handler): http.Server {
  return http.createServer(
    {
      headersTimeout: timeouts.headersMs,
      requestTimeout: timeouts.requestMs,
      keepAliveTimeout: timeouts.keepAliveMs,
      // how often Node checks headersTimeout/requestTimeout
      connectionsCheckingInterval: Math.max(10, Math.min(30_000, Math.floor(timeouts.headersMs / 4))),
    },
    serve as http.RequestListener,
  );
}

/** The h2c server, with {@link h2SessionLimits}. */
function createH2(serve: Handler): http2.Http2Server {
  return http2.createServer(
    {
      ...h2FieldWhitespace,
      maxSessionMemory: h2SessionLimits.maxSessionMemory,
      settings: {
        maxConcurrentStreams: h2SessionLimits.maxConcurrentStreams,
        maxHeaderListSize: h2SessionLimits.maxHeaderListSize,
      },
    },
    serve as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
}

/**
 * GOAWAY: open streams finish, no new ones start; the session is destroyed as soon as none is
 * open. (Node's close() alone also waits for a header block in progress, however slowly its
 * bytes arrive.)
 */
function closeSession(port: OnePort, session: http2.ServerHttp2Session): void {
  session.close();
  if (port.sessions.get(session)?.streams === 0) session.destroy();
}

/** Counts a new session's open streams; it is closed when idle for h2IdleMs, or at once while closing. */
function trackSession(port: OnePort, session: http2.ServerHttp2Session): void {
  const state = { streams: 0 };
  port.sessions.set(session, state);
  if (port.closingIdle) setImmediate(() => closeSession(port, session));
  session.setTimeout(port.timeouts.h2IdleMs, () => closeSession(port, session));
  session.on("stream", (stream: http2.ServerHttp2Stream) => {
    state.streams += 1;
    stream.once("close", () => {
      state.streams -= 1;
      // after Node's own close has had its turn
      if (state.streams === 0 && session.closed)
        setImmediate(() => {
          if (!session.destroyed) session.destroy();
        });
    });
  });
  session.on("close", () => port.sessions.delete(session));
}

/** The request deadline: a body still arriving requestMs after its HEADERS resets the stream. */
function bodyDeadline(port: OnePort, stream: http2.ServerHttp2Stream): void {
  if (stream.endAfterHeaders) return;
  const timer = setTimeout(() => {
    // remoteClose: END_STREAM received, whether or not the handler has read the body yet
    if (stream.destroyed || stream.state.remoteClose) return;
    stream.close(http2.constants.NGHTTP2_CANCEL);
    closeSession(port, stream.session as http2.ServerHttp2Session);
  }, port.timeouts.requestMs);
  const clear = () => clearTimeout(timer);
  stream.once("end", clear);
  stream.once("close", clear);
}

/** Hands `socket` to the h2c server through a JS Duplex that replays `head` first. */
function toHttp2(port: OnePort, socket: net.Socket, head: Buffer): void {
  const duplex = new Duplex({
    read() {
      socket.resume();
    },
    write(chunk, encoding, callback) {
      socket.write(chunk, encoding, callback);
    },
    final(callback) {
      socket.end(callback);
      // Node waits for the client to close its side too: bounded, for a client that never does.
      const linger = setTimeout(() => socket.destroy(), port.timeouts.closeGraceMs);
      socket.once("close", () => clearTimeout(linger));
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
  port.h2.emit("connection", duplex);
}

/** HTTP/1.1: counts `req` unfinished on its connection until its response closes. */
function trackResponse(port: OnePort, req: http.IncomingMessage, res: http.ServerResponse): void {
  const socket = req.socket;
  let pending = port.unfinished.get(socket);
  if (pending === undefined) {
    pending = new Set();
    port.unfinished.set(socket, pending);
  }
  pending.add(req);
  res.once("close", () => {
    pending.delete(req);
    if (pending.size > 0) return;
    if (port.closingIdle) setImmediate(() => port.h1.closeIdleConnections());
    const then = port.whenFinished.get(socket);
    port.whenFinished.delete(socket);
    then?.();
  });
}

/** HTTP/1.1: a request Node cannot parse, answered once, after the responses before it. */
function onClientError(port: OnePort, server: OnePortServer, err: Error, socket: net.Socket): void {
  // Node reports each later chunk of a broken connection again: answer once.
  if (port.failed.has(socket)) return;
  port.failed.add(socket);
  // fastify's clientErrorHandler (registered on the server it was given); without one, close.
  const answer = () => {
    if (socket.destroyed) return;
    if (!server.emit("clientError", err, socket)) socket.destroy();
  };
  const pending = port.unfinished.get(socket);
  // A request whose body was cut by the error cannot finish: answer at once, as Node does.
  if (pending === undefined || pending.size === 0 || [...pending].some((r) => !r.complete)) answer();
  else port.whenFinished.set(socket, answer);
}

/** A new connection: its first bytes say HTTP/1.1 or h2c, within firstBytesMs of its accept. */
function accept(port: OnePort, socket: net.Socket): void {
  // Small writes (SSE chunks, unary replies) must not wait for Nagle + delayed ACK (~40 ms).
  socket.setNoDelay(true);
  port.sockets.add(socket);
  // A fixed deadline from accept (not idle: a preface dripped byte by byte does not extend it).
  const firstBytes = setTimeout(() => socket.destroy(), port.timeouts.firstBytesMs);
  socket.on("close", () => {
    clearTimeout(firstBytes);
    port.sockets.delete(socket);
  });
  // The bytes read before the protocol is known; handed on, not kept (the listeners below live
  // as long as the connection).
  let head: Buffer | undefined;
  const onData = (data: Buffer) => {
    const bytes = head === undefined ? data : Buffer.concat([head, data]);
    const n = Math.min(bytes.length, h2Preface.length);
    const isPrefix = bytes.subarray(0, n).equals(h2Preface.subarray(0, n));
    if (isPrefix && bytes.length < h2Preface.length) {
      head = bytes;
      return; // need more bytes to decide
    }
    head = undefined;
    socket.off("data", onData);
    clearTimeout(firstBytes);
    socket.pause();
    if (isPrefix) {
      toHttp2(port, socket, bytes);
    } else {
      socket.unshift(bytes);
      port.h1.emit("connection", socket);
      socket.resume();
    }
  };
  socket.on("data", onData);
  socket.on("error", () => socket.destroy());
}
