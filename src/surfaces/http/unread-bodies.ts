import type http from "node:http";
import type http2 from "node:http2";
import type net from "node:net";

/**
 * What happens to a request whose response is sent before its body was read to the end (a body
 * over the cap sent without a length, an error answered before the body was needed, on any route
 * and protocol): the client may still be sending, and nothing reads what it sends. Left so, a
 * client that writes its whole body before it reads waits until a timeout ends the connection
 * (the keep-alive, ~66 s). So:
 * - HTTP/1.1 (here): the response says `Connection: close`. Once it is sent, the socket is
 *   half-closed (FIN after the response) and the rest of the body is read and dropped until the
 *   client closes its side, for at most `graceMs`; then the socket is destroyed. Not destroyed at
 *   once: closing a socket with bytes unread sends RST, and a client may then lose the response it
 *   has not read yet (RFC 9112 §9.6).
 * - HTTP/2 (Node's http2 does it; test/surfaces/http/unread-bodies.test.ts holds it): once the response
 *   has ended while the request's body is still coming, the stream is reset with NO_ERROR, which asks the client to stop sending without an
 *   error; it keeps the response (RFC 9113 §8.1). The session and its other streams go on.
 * Called before the request reaches the app, so that a response the app sends at once is covered.
 */
export function closeWhenBodyUnread(
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
  graceMs: number,
): void {
  if ("stream" in req) return;
  closeAfterResponse(req, res as http.ServerResponse, graceMs);
}

/** HTTP/1.1: `Connection: close` on a response whose headers go out before the body is read. */
function closeAfterResponse(req: http.IncomingMessage, res: http.ServerResponse, graceMs: number): void {
  // Taken now: a request destroyed by its reader (connect-node's, an async iterator that
  // returned) has let go of its socket by the time the response's headers go out.
  const socket = req.socket;
  const writeHead = res.writeHead;
  // Every response's headers go through writeHead (Node's implicit headers too).
  res.writeHead = function (this: http.ServerResponse, ...args: Parameters<typeof writeHead>) {
    if (!req.complete && hasBody(req)) {
      // Node writes `Connection: close` and ends the connection after this response...
      this.shouldKeepAlive = false;
      // ...with destroySoon(), which would destroy it with the body's bytes unread.
      socket.destroySoon = () => lingeringClose(socket, req, graceMs);
    }
    return writeHead.apply(this, args);
  } as typeof writeHead;
}

/**
 * True when the request has a body (RFC 9112 §6.3: a length, or Transfer-Encoding). A request
 * without one is not yet `complete` while Node's parser is still in its headers' turn: a response
 * sent at once (a pipelined GET /healthz) must keep the connection.
 */
function hasBody(req: http.IncomingMessage): boolean {
  const length = req.headers["content-length"];
  return req.headers["transfer-encoding"] !== undefined || (length !== undefined && Number(length) !== 0);
}

/** FIN, then drop what the client still sends until it closes its side, at most `graceMs`. */
function lingeringClose(socket: net.Socket, req: http.IncomingMessage, graceMs: number): void {
  if (socket.destroyed) return;
  socket.end();
  const timer = setTimeout(() => socket.destroy(), graceMs);
  socket.once("close", () => clearTimeout(timer));
  // Node's parser goes on feeding the body to the request, which stops the socket when it takes
  // no more (it never will: a reader that gave up, or one that destroyed it). `_dump()` is Node's
  // own way to drop a body nobody reads (what it does for a request the app never read): from
  // then on the parser drops the body's bytes; and the socket is read again.
  (req as http.IncomingMessage & { _dump(): void })._dump();
  socket.resume();
  req.on("error", () => {});
}
