import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  type HandlerContext,
} from "@connectrpc/connect";
import {
  CompletionsService,
  type CreateCompletionRequest,
  CreateCompletionRequestSchema,
  DetokenizeRequestSchema,
  ListModelsRequestSchema,
  type StreamCompletionResponse,
  TokenizeRequestSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { ApiError, callerDeadlineExceeded, newRequestId } from "../../core/errors/index.js";
import type { ShutdownLink } from "../../core/index.js";
import type { CallContext, CompletionsApi } from "../../service/index.js";
import { callRecordKey } from "../../telemetry/rpc-outcome.js";
import { toConnectError } from "./error-conversion.js";
import { callerTimeoutMs } from "./explain-protocol-error.js";
import { connectJsonOptions } from "./strict-json-text.js";

/**
 * The request id the server gave the HTTP request (so the X-Request-Id header and the envelope
 * agree); set through the Connect plugin's `contextValues`.
 */
export const requestIdKey = createContextKey<string | undefined>(undefined, {
  description: "acs request id",
});

/**
 * Ends the call's transport at once — HTTP/1.1: its connection; HTTP/2: its stream, reset with
 * CANCEL — and wakes connect-node's wait for 'drain', so that the call's handler ends; set by the
 * server (`endTransport`, src/surfaces/http/one-port-server.ts) through the Connect plugin's
 * `contextValues`. Without it a stalled stream is only closed on our side.
 */
export const endTransportKey = createContextKey<(() => void) | undefined>(undefined, {
  description: "acs end the call's transport",
});

/** Options of {@link createConnectRoutes}. */
export interface ConnectRoutesOptions {
  /**
   * Milliseconds a stream may wait for its caller to take a message (connect-node pulls the next
   * one only once the response took the last: 'drain') before it is ended: Inference aborted, the
   * Hold settled, the transport ended (ACS_STREAM_STALL_MS).
   */
  readonly streamStallMs: number;
  /** Told of each stream ended for a stalled caller (info). @default none */
  readonly logger?: { info(obj: object, msg: string): void };
}

/**
 * The items of `source`, until its consumer stalls: when the consumer has not asked for the next
 * item `stallMs` after it was handed one, `source` is closed at once (`return()`: a generator
 * runs its `finally` then) and `onStall` runs; the iteration ends there. A consumer that pulls
 * within `stallMs` each time sees `source` unchanged. Closing this iterator closes `source`.
 */
export async function* endWhenStalled<T>(
  source: AsyncIterable<T>,
  stallMs: number,
  onStall: () => void,
): AsyncGenerator<T> {
  const it = source[Symbol.asyncIterator]();
  let stalled = false;
  try {
    for (;;) {
      const next = await it.next();
      if (next.done === true) return;
      const timer = setTimeout(() => {
        stalled = true;
        // `source` waits at its yield: return() runs its finally now, whatever the consumer does.
        void it.return?.()?.catch(() => {});
        onStall();
      }, stallMs);
      try {
        yield next.value;
      } finally {
        clearTimeout(timer);
      }
      if (stalled) return;
    }
  } finally {
    if (!stalled) await it.return?.();
  }
}

/**
 * The call's signal for the service, aborted with an ApiError reason: `deadline_exceeded` when the
 * deadline the caller set (Connect-Timeout-Ms, grpc-timeout) passed — the service and the Inference
 * client keep that reason, so the call ends 504 / DEADLINE_EXCEEDED — else `canceled`; or with the
 * shutdown's reason when the server's grace is over (`controller` is tied to the shutdown link by
 * the caller).
 */
function callSignal(
  ctx: HandlerContext,
  controller: AbortController,
): { signal: AbortSignal; detach: () => void } {
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
  // connect-es aborts ctx.signal at the end of every call, a complete one too: once the handler
  // has returned, nothing listens to the call's signal, so no `canceled` ApiError is built then.
  return { signal: controller.signal, detach: () => ctx.signal.removeEventListener("abort", onAbort) };
}

/** The service's context of a call, and the function that detaches it from connect-es's signal. */
function callContext(
  ctx: HandlerContext,
  controller: AbortController,
): { call: CallContext; detach: () => void } {
  let requestId = ctx.values.get(requestIdKey);
  // The server sends its id as X-Request-Id; a router used without it names and sends its own.
  if (requestId === undefined) {
    requestId = newRequestId();
    ctx.responseHeader.set("x-request-id", requestId);
  }
  const record = ctx.values.get(callRecordKey);
  const { signal, detach } = callSignal(ctx, controller);
  const call: CallContext = {
    ...(record === undefined ? {} : { record }),
    requestId,
    signal,
    authorization: ctx.requestHeader.get("authorization") ?? undefined,
    setResponseHeader: (name, value) => ctx.responseHeader.set(name, value),
  };
  return { call, detach };
}

/** What the Connect routes call and how: the service, the shutdown link, the stall bound. */
export interface RouteDeps {
  readonly api: CompletionsApi;
  readonly shutdown: ShutdownLink | undefined;
  readonly stallMs: number;
  readonly logger: ConnectRoutesOptions["logger"];
}

/** The call's context, and the function that unties it from the shutdown link and from connect-es's signal. */
function openCall(
  deps: Pick<RouteDeps, "shutdown">,
  ctx: HandlerContext,
): { call: CallContext; untie: () => void } {
  const controller = new AbortController();
  const unlink = deps.shutdown?.tie(controller);
  const { call, detach } = callContext(ctx, controller);
  const untie = (): void => {
    detach();
    unlink?.();
  };
  return { call, untie };
}

/**
 * The error as the caller sees it: a call cut short by the shutdown gets the shutdown's, and its
 * record (the access line, the metrics) that code instead of the `canceled` the service recorded.
 */
function shown(deps: Pick<RouteDeps, "shutdown">, err: unknown, call: CallContext): ConnectError {
  const { shutdown } = deps;
  return toConnectError(shutdown === undefined ? err : shutdown.shown(err, call.record), call.requestId);
}

/** A unary call of the service: its context opened and untied, its error as the caller sees it. */
export function unary<I, O>(
  deps: Pick<RouteDeps, "shutdown">,
  method: (request: I, call: CallContext) => Promise<O>,
) {
  return async (request: I, ctx: HandlerContext): Promise<O> => {
    const { call, untie } = openCall(deps, ctx);
    try {
      return await method(request, call);
    } catch (err) {
      throw shown(deps, err, call);
    } finally {
      untie();
    }
  };
}

/** StreamCompletion: the service's stream, ended when its caller stalls ({@link endWhenStalled}). */
async function* streamCompletion(
  deps: RouteDeps,
  request: CreateCompletionRequest,
  ctx: HandlerContext,
): AsyncGenerator<StreamCompletionResponse> {
  const { stallMs } = deps;
  const { call, untie } = openCall(deps, ctx);
  const endTransport = ctx.values.get(endTransportKey);
  let stalled = false;
  const onStall = (): void => {
    stalled = true;
    // The access log and metrics count it as a cancel, on every transport.
    if (call.record !== undefined) call.record.errorCode = "canceled";
    deps.logger?.info(
      { requestId: call.requestId, stallMs },
      `stream ended: its caller has not read for ${stallMs} ms`,
    );
    endTransport?.();
  };
  try {
    yield* endWhenStalled(deps.api.streamCompletion(request, call), stallMs, onStall);
    // Pulled once more after the stall (connect-node, woken by the transport's end): the call did
    // not complete, so it ends `canceled` — never as a complete stream (an OK end-stream message or
    // trailers), in the access log or for a caller that reads again.
    if (stalled) {
      throw new ApiError("canceled", `The stream was ended: its caller had not read for ${stallMs} ms.`);
    }
  } catch (err) {
    throw shown(deps, err, call);
  } finally {
    untie();
  }
}

/**
 * Registers acs.v1.CompletionsService on a Connect router (Connect, gRPC and gRPC-Web), calling the
 * same CompletionsApi as REST. Every error leaves as a ConnectError with the ErrorEnvelope detail.
 * With `shutdown` (src/surfaces/http/lifecycle.ts), each call is tied to it while it runs: when the
 * server's grace is over, a call still running ends with the shutdown's error (UNAVAILABLE
 * `upstream_unavailable`) instead of `canceled`. A stream whose caller stops reading is ended after
 * `options.streamStallMs` ({@link endWhenStalled}). Each method's Connect JSON is checked against
 * its input's fields as REST checks a body (an integer field's string too: strict-json-text.ts).
 */
export function createConnectRoutes(
  api: CompletionsApi,
  shutdown: ShutdownLink | undefined,
  options: ConnectRoutesOptions,
): (router: ConnectRouter) => void {
  const deps: RouteDeps = {
    api,
    shutdown,
    stallMs: options.streamStallMs,
    logger: options.logger,
  };
  const { method } = CompletionsService;
  const completionJson = { jsonOptions: connectJsonOptions(CreateCompletionRequestSchema) };
  return (router) => {
    router.rpc(
      method.createCompletion,
      unary(deps, (request, call) => api.createCompletion(request, call)),
      completionJson,
    );
    router.rpc(
      method.streamCompletion,
      (request, ctx) => streamCompletion(deps, request, ctx),
      completionJson,
    );
    router.rpc(
      method.listModels,
      unary(deps, (_request, call) => api.listModels(call)),
      { jsonOptions: connectJsonOptions(ListModelsRequestSchema) },
    );
    router.rpc(
      method.tokenize,
      unary(deps, (request, call) => api.tokenize(request, call)),
      {
        jsonOptions: connectJsonOptions(TokenizeRequestSchema),
      },
    );
    router.rpc(
      method.detokenize,
      unary(deps, (request, call) => api.detokenize(request, call)),
      {
        jsonOptions: connectJsonOptions(DetokenizeRequestSchema),
      },
    );
  };
}
