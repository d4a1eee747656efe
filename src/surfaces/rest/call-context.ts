import type { FastifyReply, FastifyRequest } from "fastify";
import { ApiError } from "../../core/errors/index.js";
import type { ShutdownLink } from "../../core/index.js";
import type { CallContext } from "../../service/types.js";
import { callRecordOf } from "../../telemetry/request-telemetry.js";
import { requestIdOf } from "./send-error.js";

/**
 * The service's CallContext for one REST request:
 * - `requestId`: the `X-Request-Id` of the response (see requestIdOf);
 * - `signal`: aborted (reason: ApiError `canceled`) when the connection closes before the
 *   response finished — the response's 'close', not the request's, which fires once the body
 *   has been read — or with the shutdown's reason when `shutdown` aborts first. The call is tied
 *   to `shutdown` until its response closes, then untied (nothing of it stays on the link);
 * - `authorization`: the raw `Authorization` header;
 * - `setResponseHeader`: a header of this response (ignored once the response has started);
 * - `record`: the request's record for the access log, metrics and traces (src/telemetry).
 */
export function createCallContext(
  request: FastifyRequest,
  reply: FastifyReply,
  shutdown?: ShutdownLink,
): CallContext {
  const controller = new AbortController();
  const untie = shutdown?.tie(controller);
  const res = reply.raw;
  const onClose = (): void => {
    untie?.();
    if (!res.writableEnded) {
      controller.abort(new ApiError("canceled", "The client closed the connection."));
    }
  };
  if (res.destroyed) onClose();
  // `on`: 'close' is emitted once; `once` would wrap the listener in a bound function and its state.
  else res.on("close", onClose);
  const authorization = request.headers.authorization;
  const context: { -readonly [K in keyof CallContext]: CallContext[K] } = {
    requestId: requestIdOf(reply),
    signal: controller.signal,
    authorization: typeof authorization === "string" ? authorization : undefined,
    setResponseHeader(name, value) {
      if (!res.headersSent) reply.header(name, value);
    },
  };
  const record = callRecordOf(request);
  if (record !== undefined) context.record = record;
  return context;
}
