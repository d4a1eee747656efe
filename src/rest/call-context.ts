import type { FastifyReply, FastifyRequest } from "fastify";
import { ApiError } from "../errors/index.js";
import type { CallContext } from "../service/types.js";
import { requestIdOf } from "./send-error.js";

/**
 * The service's CallContext for one REST request:
 * - `requestId`: the `X-Request-Id` of the response (see requestIdOf);
 * - `signal`: aborted (reason: ApiError `canceled`) when the connection closes before the
 *   response finished — the response's 'close', not the request's, which fires once the body
 *   has been read;
 * - `authorization`: the raw `Authorization` header;
 * - `setResponseHeader`: a header of this response (ignored once the response has started).
 */
export function createCallContext(
  request: FastifyRequest,
  reply: FastifyReply,
  shutdown?: AbortSignal,
): CallContext {
  const controller = new AbortController();
  const res = reply.raw;
  const onClose = (): void => {
    if (!res.writableEnded) {
      controller.abort(new ApiError("canceled", "The client closed the connection."));
    }
  };
  if (res.destroyed) onClose();
  else res.once("close", onClose);
  const authorization = request.headers.authorization;
  return {
    requestId: requestIdOf(reply),
    signal: shutdown === undefined ? controller.signal : AbortSignal.any([controller.signal, shutdown]),
    authorization: typeof authorization === "string" ? authorization : undefined,
    setResponseHeader(name, value) {
      if (!res.headersSent) reply.header(name, value);
    },
  };
}
