import { create } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import {
  Health,
  HealthCheckResponseSchema,
  HealthListResponseSchema,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "../../gen/grpc/health/v1/health_pb.js";
import { ApiError, newRequestId } from "../errors/index.js";
import { toConnectError } from "./error-conversion.js";

/** What the health routes follow of the server's lifecycle (src/server/lifecycle.ts). */
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

import { requestIdKey } from "./routes.js";

/** Services the health protocol reports on for the gateway as a whole ("" is the server). */
const gatewayServices = ["", CompletionsService.typeName];

/**
 * Registers grpc.health.v1.Health (Check, Watch, List) for load balancers and Kubernetes gRPC
 * probes. The server ("") and `acs.v1.CompletionsService` are SERVING when `isReady()`; each model
 * is a service named by its id, SERVING while it serves (`modelStatus`, e.g. one replica up) and
 * the gateway is ready; else NOT_SERVING. An unknown service name is NOT_FOUND on Check and
 * SERVICE_UNKNOWN on Watch (per the protocol). Watch sends the current status and then each
 * change, looked at every `pollMs` and at each change of the lifecycle's phase (so the drain's
 * NOT_SERVING goes out at once). When the server stops accepting, an open Watch sends its last
 * status and ends with UNAVAILABLE `upstream_unavailable` (it would otherwise hold the shutdown:
 * a load balancer keeps it open for ever).
 */
export function createHealthRoutes(
  isReady: () => boolean,
  modelStatus: () => ReadonlyArray<{ readonly id: string; readonly serving: boolean }> = () => [],
  options: HealthRoutesOptions = {},
): (router: ConnectRouter) => void {
  const pollMs = options.pollMs ?? 1000;
  const lifecycle = options.lifecycle;
  const servingOf = (service: string): boolean | undefined => {
    if (gatewayServices.includes(service)) return isReady();
    const model = modelStatus().find((m) => m.id === service);
    return model === undefined ? undefined : model.serving && isReady();
  };
  const known = (service: string) => servingOf(service) !== undefined;
  const services = () => [...gatewayServices, ...modelStatus().map((m) => m.id)];
  const status = (service: string) => {
    const serving = servingOf(service);
    return serving === undefined
      ? ServingStatus.SERVICE_UNKNOWN
      : serving
        ? ServingStatus.SERVING
        : ServingStatus.NOT_SERVING;
  };
  return (router) => {
    router.service(Health, {
      check(request, ctx) {
        if (!known(request.service)) {
          const requestId = ctx.values.get(requestIdKey) ?? newRequestId();
          const unknown = new ApiError(
            "unknown_service",
            `Unknown service '${request.service}': this server reports on '' (the server), ${CompletionsService.typeName} and each model id.`,
          );
          throw toConnectError(unknown, requestId);
        }
        return create(HealthCheckResponseSchema, { status: status(request.service) });
      },
      async *watch(request, ctx) {
        let last: ServingStatus | undefined;
        // A change of phase (or the call's end) cuts the wait short; one that comes while a
        // status is being sent is remembered, so none is missed.
        let changed = false;
        let wakeUp: (() => void) | undefined;
        const onChange = () => {
          changed = true;
          wakeUp?.();
        };
        const unsubscribe = lifecycle?.onChange(onChange);
        ctx.signal.addEventListener("abort", onChange, { once: true });
        try {
          while (!ctx.signal.aborted) {
            changed = false;
            const now = status(request.service);
            if (now !== last) {
              last = now;
              yield create(HealthCheckResponseSchema, { status: now });
            }
            if (lifecycle?.stopped) {
              throw toConnectError(stoppingError(), ctx.values.get(requestIdKey) ?? newRequestId());
            }
            if (changed) continue;
            await new Promise<void>((resolve) => {
              const timer = setTimeout(resolve, pollMs);
              wakeUp = () => {
                clearTimeout(timer);
                resolve();
              };
            });
            wakeUp = undefined;
          }
        } finally {
          unsubscribe?.();
          ctx.signal.removeEventListener("abort", onChange);
        }
      },
      list() {
        return create(HealthListResponseSchema, {
          statuses: Object.fromEntries(
            services().map((s) => [s, create(HealthCheckResponseSchema, { status: status(s) })]),
          ),
        });
      },
    });
  };
}
