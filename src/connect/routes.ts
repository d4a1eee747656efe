import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  type HandlerContext,
} from "@connectrpc/connect";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { ApiError, callerDeadlineExceeded, newRequestId } from "../errors/index.js";
import type { CallContext, CompletionsApi } from "../service/index.js";
import { callRecordKey } from "../telemetry/rpc-outcome.js";
import { toConnectError } from "./error-conversion.js";
import { callerTimeoutMs } from "./explain-protocol-error.js";

/**
 * The request id the server gave the HTTP request (so the X-Request-Id header and the envelope
 * agree); set through the Connect plugin's `contextValues`.
 */
export const requestIdKey = createContextKey<string | undefined>(undefined, {
  description: "acs request id",
});

/**
 * The call's signal for the service, aborted with an ApiError reason: `deadline_exceeded` when the
 * deadline the caller set (Connect-Timeout-Ms, grpc-timeout) passed — the service and the Inference
 * client keep that reason, so the call ends 504 / DEADLINE_EXCEEDED — else `canceled`.
 */
function callSignal(ctx: HandlerContext): AbortSignal {
  const controller = new AbortController();
  const onAbort = (): void => {
    const reason: unknown = ctx.signal.reason;
    controller.abort(
      reason instanceof ConnectError && reason.code === Code.DeadlineExceeded
        ? callerDeadlineExceeded(callerTimeoutMs(ctx.requestHeader.get("content-type"), ctx.requestHeader))
        : new ApiError("canceled", "The client canceled the call."),
    );
  };
  if (ctx.signal.aborted) onAbort();
  else ctx.signal.addEventListener("abort", onAbort, { once: true });
  return controller.signal;
}

function callContext(ctx: HandlerContext): CallContext {
  let requestId = ctx.values.get(requestIdKey);
  // The server sends its id as X-Request-Id; a router used without it names and sends its own.
  if (requestId === undefined) {
    requestId = newRequestId();
    ctx.responseHeader.set("x-request-id", requestId);
  }
  const record = ctx.values.get(callRecordKey);
  return {
    ...(record === undefined ? {} : { record }),
    requestId,
    signal: callSignal(ctx),
    authorization: ctx.requestHeader.get("authorization") ?? undefined,
    setResponseHeader: (name, value) => ctx.responseHeader.set(name, value),
  };
}

/**
 * Registers acs.v1.CompletionsService on a Connect router (Connect, gRPC and gRPC-Web), calling the
 * same CompletionsApi as REST. Every error leaves as a ConnectError with the ErrorEnvelope detail.
 */
export function createConnectRoutes(api: CompletionsApi): (router: ConnectRouter) => void {
  return (router) => {
    router.service(CompletionsService, {
      async createCompletion(request, ctx) {
        const call = callContext(ctx);
        try {
          return await api.createCompletion(request, call);
        } catch (err) {
          throw toConnectError(err, call.requestId);
        }
      },
      async *streamCompletion(request, ctx) {
        const call = callContext(ctx);
        try {
          yield* api.streamCompletion(request, call);
        } catch (err) {
          throw toConnectError(err, call.requestId);
        }
      },
      async listModels(_request, ctx) {
        const call = callContext(ctx);
        try {
          return await api.listModels(call);
        } catch (err) {
          throw toConnectError(err, call.requestId);
        }
      },
    });
  };
}
