import type { ServerResponse } from "node:http";
import type { Http2ServerResponse } from "node:http2";
import type { ConnectError } from "@connectrpc/connect";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { endStreamFlag, endStreamToJson, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";

/**
 * Answers a Connect, gRPC or gRPC-Web request with `error` in that protocol's own error form,
 * without running the handler — for refusals made before connect-node reads the body (a body over
 * the size limit). The error's details (our acs.v1.ErrorEnvelope) travel as each protocol carries
 * them. Connect unary answers with `httpStatus` (413 for a body too large, per API.md §4); the
 * streaming protocols answer 200 with the error in their end-of-stream (gRPC: trailers-only
 * headers). Uses connect-es's protocol helpers (pinned version; they are marked internal).
 */
export function writeProtocolError(
  contentType: string | undefined,
  error: ConnectError,
  httpStatus: number,
  res: ServerResponse | Http2ServerResponse,
): void {
  const type = (contentType ?? "").toLowerCase();
  const headers = (h: Headers): Record<string, string> => Object.fromEntries(h.entries());
  if (type.startsWith("application/grpc-web")) {
    const trailer = trailerSerialize(setTrailerStatus(new Headers(), error));
    res.writeHead(200, { "content-type": type });
    res.end(encodeEnvelope(trailerFlag, trailer));
  } else if (type.startsWith("application/grpc")) {
    res.writeHead(200, { "content-type": type, ...headers(setTrailerStatus(new Headers(), error)) });
    res.end();
  } else if (type.startsWith("application/connect+")) {
    const json = JSON.stringify(endStreamToJson(new Headers(), error, {}));
    res.writeHead(200, { "content-type": type });
    res.end(encodeEnvelope(endStreamFlag, new TextEncoder().encode(json)));
  } else {
    res.writeHead(httpStatus, { "content-type": "application/json" });
    res.end(errorToJsonBytes(error, {}));
  }
}
