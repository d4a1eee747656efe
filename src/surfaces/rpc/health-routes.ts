import { create } from "@bufbuild/protobuf";
import type { ConnectRouter, HandlerContext } from "@connectrpc/connect";
import { CompletionsService } from "../../../gen/acs/v1/completions_pb.js";
import {
  Health,
  type HealthCheckRequest,
  type HealthCheckResponse,
  HealthCheckResponseSchema,
  HealthListResponseSchema,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "../../../gen/grpc/health/v1/health_pb.js";
import { ApiError, newRequestId } from "../../core/errors/index.js";
import { toConnectError } from "./error-conversion.js";
import { requestIdKey } from "./routes.js";
import { connectJsonOptions } from "./strict-json-text.js";

/** What the health routes follow of the server's lifecycle (src/surfaces/http/lifecycle.ts). */
export interface HealthLifecycle {
  /** True once the server stops accepting: open Watch streams end. */
  readonly stopped: boolean;
  /** Calls `listener` on each change of phase; returns the function that removes it. */
  onChange(listener: () => void): () => void;
}

/** Options of {@link createHealthRoutes}. */
export interface HealthRoutesOptions {
  /** How often Watch looks at the status between lifecycle changes, ms. @default 1000 */
  readonly pollMs?: number;
  /** A change of phase wakes every Watch at once (drain: NOT_SERVING now); stopping ends them. */
  readonly lifecycle?: HealthLifecycle;
}

/** The error an open Watch ends with when the server stops accepting (UNAVAILABLE, the envelope). */
const stoppingError = () =>
  new ApiError("upstream_unavailable", "The server is shutting down; retry the request.");

/** Services the health protocol reports on for the gateway as a whole ("" is the server). */
const gatewayServices = ["", CompletionsService.typeName];

/** What the health routes report from: readiness, the models, the lifecycle. */
interface HealthSource {
  readonly isReady: () => boolean;
  readonly modelStatus: () => ReadonlyArray<{ readonly id: string; readonly serving: boolean }>;
  readonly pollMs: number;
  readonly lifecycle: HealthLifecycle | undefined;
}

/** Whether `service` serves; undefined for a service this server does not report on. */
function servingOf(source: HealthSource, service: string): boolean | undefined {
  if (gatewayServices.includes(service)) return source.isReady();
  const model = source.modelStatus().find((m) => m.id === service);
  return model === undefined ? undefined : model.serving && source.isReady();
}

function statusOf(source: HealthSource, service: string): ServingStatus {
  const serving = servingOf(source, service);
  return serving === undefined
    ? ServingStatus.SERVICE_UNKNOWN
    : serving
      ? ServingStatus.SERVING
      : ServingStatus.NOT_SERVING;
}

function check(source: HealthSource, request: HealthCheckRequest, ctx: HandlerContext): HealthCheckResponse {
  if (servingOf(source, request.service) === undefined) {
    const requestId = ctx.values.get(requestIdKey) ?? newRequestId();
    const unknown = new ApiError(
      "unknown_service",
      `Unknown service '${request.service}': this server reports on '' (the server), ${CompletionsService.typeName} and each model id.`,
    );
    throw toConnectError(unknown, requestId);
  }
  return create(HealthCheckResponseSchema, { status: statusOf(source, request.service) });
}

/** A Watch's wake-ups: a change of phase (or the call's end) cuts its wait short. */
interface WatchWake {
  /** A change came since the status was last looked at (none is missed while one is sent). */
  changed: boolean;
  wakeUp: (() => void) | undefined;
}

/** Waits `pollMs`, or until `wake` is woken. */
function pause(wake: WatchWake, pollMs: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, pollMs);
    wake.wakeUp = () => {
      clearTimeout(timer);
      resolve();
    };
  });
}

async function* watch(
  source: HealthSource,
  request: HealthCheckRequest,
  ctx: HandlerContext,
): AsyncGenerator<HealthCheckResponse> {
  const { lifecycle } = source;
  let last: ServingStatus | undefined;
  const wake: WatchWake = { changed: false, wakeUp: undefined };
  const onChange = () => {
    wake.changed = true;
    wake.wakeUp?.();
  };
  const unsubscribe = lifecycle?.onChange(onChange);
  ctx.signal.addEventListener("abort", onChange, { once: true });
  try {
    while (!ctx.signal.aborted) {
      wake.changed = false;
      const now = statusOf(source, request.service);
      if (now !== last) {
        last = now;
        yield create(HealthCheckResponseSchema, { status: now });
      }
      if (lifecycle?.stopped) {
        throw toConnectError(stoppingError(), ctx.values.get(requestIdKey) ?? newRequestId());
      }
      if (wake.changed) continue;
      await pause(wake, source.pollMs);
      wake.wakeUp = undefined;
    }
  } finally {
    unsubscribe?.();
    ctx.signal.removeEventListener("abort", onChange);
  }
}

function list(source: HealthSource) {
  const services = [...gatewayServices, ...source.modelStatus().map((m) => m.id)];
  return create(HealthListResponseSchema, {
    statuses: Object.fromEntries(
      services.map((s) => [s, create(HealthCheckResponseSchema, { status: statusOf(source, s) })]),
    ),
  });
}

/**
 * Registers grpc.health.v1.Health (Check, Watch, List) for load balancers and Kubernetes gRPC
 * probes. The server ("") and `acs.v1.CompletionsService` are SERVING when `isReady()`; each model
 * is a service named by its id, SERVING while it serves (`modelStatus`, e.g. one replica up) and
 * the gateway is ready; else NOT_SERVING. An unknown service name is NOT_FOUND on Check and
 * SERVICE_UNKNOWN on Watch (per the protocol). Watch sends the current status and then each
 * change, looked at every `pollMs` and at each change of the lifecycle's phase (so the drain's
 * NOT_SERVING goes out at once). When the server stops accepting, an open Watch sends its last
 * status and ends with UNAVAILABLE `upstream_unavailable` (it would otherwise hold the shutdown:
 * a load balancer keeps it open for ever). Each method's Connect JSON is read by the strict
 * decoder of its input (src/surfaces/rpc/strict-json-text.ts).
 */
export function createHealthRoutes(
  isReady: () => boolean,
  modelStatus: () => ReadonlyArray<{ readonly id: string; readonly serving: boolean }> = () => [],
  options: HealthRoutesOptions = {},
): (router: ConnectRouter) => void {
  const source: HealthSource = {
    isReady,
    modelStatus,
    pollMs: options.pollMs ?? 1000,
    lifecycle: options.lifecycle,
  };
  const { check: checkMethod, watch: watchMethod, list: listMethod } = Health.method;
  return (router) => {
    router.rpc(checkMethod, (request, ctx) => check(source, request, ctx), {
      jsonOptions: connectJsonOptions(checkMethod.input),
    });
    router.rpc(watchMethod, (request, ctx) => watch(source, request, ctx), {
      jsonOptions: connectJsonOptions(watchMethod.input),
    });
    router.rpc(listMethod, () => list(source), { jsonOptions: connectJsonOptions(listMethod.input) });
  };
}
