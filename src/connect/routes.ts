import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  type HandlerContext,
} from "@connectrpc/connect";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { ApiError, callerDeadlineExceeded, newRequestId } from "../errors/index.js";
import type { ShutdownLink } from "../rest/index.js";
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
 * client keep that reason, so the call ends 504 / DEADLINE_EXCEEDED — else `canceled`; or with the
 * shutdown's reason when the server's grace is over (`controller` is tied to the shutdown link by
 * the caller).
 */
function callSignal(ctx: HandlerContext, controller: AbortController): AbortSignal {
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

function callContext(ctx: HandlerContext, controller: AbortController): CallContext {
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
    signal: callSignal(ctx, controller),
    authorization: ctx.requestHeader.get("authorization") ?? undefined,
    setResponseHeader: (name, value) => ctx.responseHeader.set(name, value),
  };
}

/**
 * Registers acs.v1.CompletionsService on a Connect router (Connect, gRPC and gRPC-Web), calling the
 * same CompletionsApi as REST. Every error leaves as a ConnectError with the ErrorEnvelope detail.
 * With `shutdown` (src/server/lifecycle.ts), each call is tied to it while it runs: when the
 * server's grace is over, a call still running ends with the shutdown's error (UNAVAILABLE
 * `upstream_unavailable`) instead of `canceled`.
 */
export function createConnectRoutes(
  api: CompletionsApi,
  shutdown?: ShutdownLink,
): (router: ConnectRouter) => void {
  /** The call's context, and the function that unties it from the shutdown link. */
  const open = (ctx: HandlerContext): { call: CallContext; untie: () => void } => {
    const controller = new AbortController();
    const untie = shutdown?.tie(controller) ?? (() => {});
    return { call: callContext(ctx, controller), untie };
  };
  /** The error as the caller sees it: a call cut short by the shutdown gets the shutdown's. */
  const shown = (err: unknown, call: CallContext): ConnectError => {
    const reason: unknown = shutdown?.signal.aborted ? shutdown.signal.reason : undefined;
    const cut = reason instanceof ApiError && err instanceof ApiError && err.code === "canceled";
    return toConnectError(cut ? reason : err, call.requestId);
  };
  return (router) => {
    router.service(CompletionsService, {
      async createCompletion(request, ctx) {
        const { call, untie } = open(ctx);
        try {
          return await api.createCompletion(request, call);
        } catch (err) {
          throw shown(err, call);
        } finally {
          untie();
        }
      },
      async *streamCompletion(request, ctx) {
        const { call, untie } = open(ctx);
        try {
          yield* api.streamCompletion(request, call);
        } catch (err) {
          throw shown(err, call);
        } finally {
          untie();
        }
      },
      async listModels(_request, ctx) {
        const { call, untie } = open(ctx);
        try {
          return await api.listModels(call);
        } catch (err) {
          throw shown(err, call);
        } finally {
          untie();
        }
      },
    });
  };
}
