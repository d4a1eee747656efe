// Ending one request's transport at once (HTTP/2: its stream; HTTP/1.1: its connection), for a
// response that cannot be finished: src/surfaces/rpc's stall handling calls it through build-server.ts.
import type http from "node:http";
import http2 from "node:http2";

/**
 * Ends the transport of one request at once, for a response that cannot be finished (a stream
 * whose caller stopped reading):
 * - HTTP/2: the request's stream is reset with RST_STREAM CANCEL (gRPC clients read `CANCELLED`,
 *   connect-es `canceled`); its session and the session's other streams go on.
 * - HTTP/1.1: the request's connection (socket) is destroyed. Not `req.destroy()`: Node destroys
 *   the socket only for a request whose body has not been read in full (connect-node has read it
 *   before the first response byte), and an Http2ServerRequest's `destroy()` leaves its stream be.
 *
 * A writer of `res` waiting for 'drain' is woken too (one 'drain', emitted only to listeners):
 * Node emits neither 'drain' nor 'error' on a response whose transport ends while a write waits,
 * and calls that write back without an error (Node 20) or with `ECANCELED` (Node 22), so
 * connect-node (`universalResponseToNodeResponse`, which waits for 'drain' or 'error') would wait
 * forever with the RPC's generator suspended, or fail the RPC as `internal` and print it. Woken
 * before the transport ends, it pulls the generator (which has ended) and writes its last frame,
 * which fails or is dropped: at once on HTTP/2 (the stream is ending), and on HTTP/1.1 once `res`
 * has closed, where it is woken again (a destroyed socket's response takes writes until then
 * without calling them back). A transport already ended is left as it is.
 */
export function endTransport(
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
): void {
  const wake = (): void => {
    if (res.listenerCount("drain") > 0) res.emit("drain");
  };
  // Synchronous: the writer resumes in a microtask, after the transport has ended below.
  wake();
  if ("stream" in req) {
    // close() ends the stream's writable side at once: a write from here on fails.
    if (!req.stream.destroyed) req.stream.close(http2.constants.NGHTTP2_CANCEL);
    return;
  }
  req.socket.destroy();
  if ((res as http.ServerResponse).destroyed) wake();
  else res.once("close", wake);
}
