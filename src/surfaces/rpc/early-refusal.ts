// connect-es's early refusals — a bare 405, 415 or 505 with no body, before any handler runs — in
// the API's words, as src/surfaces/rpc/error-envelopes.ts answers them.
import type { UniversalHandler, UniversalServerRequest } from "@connectrpc/connect/protocol";
import { ApiError } from "../../core/errors/index.js";

/** The Content-Types `handler`'s method is served with, as a refusal lists them. */
function servedTypes(handler: UniversalHandler): string {
  switch (handler.method.methodKind) {
    case "unary":
      return "application/json or application/proto (Connect), application/grpc (gRPC) or application/grpc-web (gRPC-Web)";
    case "server_streaming":
      return "application/connect+json or application/connect+proto (Connect), application/grpc (gRPC) or application/grpc-web (gRPC-Web)";
    default:
      return "application/grpc (gRPC)";
  }
}

/**
 * What an early refusal of connect-es (a bare `status` 405, 415 or 505) means, in the API's words:
 * 405 and 505 `method_not_allowed` (a method the RPC does not take; a bidirectional stream over
 * HTTP/1.1), else 415 `unsupported_media_type` naming the Content-Types served.
 */
export function earlyRefusal(
  status: number,
  handler: UniversalHandler,
  req: UniversalServerRequest,
): ApiError {
  const path = new URL(req.url).pathname;
  const target = `${handler.service.typeName}/${handler.method.name}`;
  if (status === 405) {
    return new ApiError(
      "method_not_allowed",
      `Method ${req.method} is not allowed on ${path}; use ${handler.allowedMethods.join(" or ")}.`,
    );
  }
  if (status === 505) {
    return new ApiError(
      "method_not_allowed",
      `${target} is a bidirectional stream: call it with gRPC over HTTP/2 (this request came over HTTP/${req.httpVersion}).`,
    );
  }
  const sent = req.header.get("content-type");
  const what =
    sent === null || sent === "" ? "No Content-Type" : `Unsupported Content-Type '${sent.slice(0, 64)}'`;
  return new ApiError("unsupported_media_type", `${what} for ${path}: send ${servedTypes(handler)}.`);
}
