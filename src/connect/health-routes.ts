import { setTimeout as sleep } from "node:timers/promises";
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
import { requestIdKey } from "./routes.js";

/** Services the health protocol reports on: "" is the server as a whole. */
const services = ["", CompletionsService.typeName];

/**
 * Registers grpc.health.v1.Health (Check, Watch, List) for load balancers and Kubernetes gRPC
 * probes: SERVING when `isReady()`, else NOT_SERVING; an unknown service name is NOT_FOUND on
 * Check and SERVICE_UNKNOWN on Watch (per the protocol). Watch sends the current status and then
 * each change, polled every `pollMs`.
 */
export function createHealthRoutes(isReady: () => boolean, pollMs = 1000): (router: ConnectRouter) => void {
  const status = (service: string) =>
    !services.includes(service)
      ? ServingStatus.SERVICE_UNKNOWN
      : isReady()
        ? ServingStatus.SERVING
        : ServingStatus.NOT_SERVING;
  return (router) => {
    router.service(Health, {
      check(request, ctx) {
        if (!services.includes(request.service)) {
          const requestId = ctx.values.get(requestIdKey) ?? newRequestId();
          const unknown = new ApiError(
            "unknown_service",
            `Unknown service '${request.service}': this server reports on '' (the server) and ${CompletionsService.typeName}.`,
          );
          throw toConnectError(unknown, requestId);
        }
        return create(HealthCheckResponseSchema, { status: status(request.service) });
      },
      async *watch(request, ctx) {
        let last: ServingStatus | undefined;
        while (!ctx.signal.aborted) {
          const now = status(request.service);
          if (now !== last) {
            last = now;
            yield create(HealthCheckResponseSchema, { status: now });
          }
          await sleep(pollMs, undefined, { signal: ctx.signal }).catch(() => undefined);
        }
      },
      list() {
        return create(HealthListResponseSchema, {
          statuses: Object.fromEntries(
            services.map((s) => [s, create(HealthCheckResponseSchema, { status: status(s) })]),
          ),
        });
      },
    });
  };
}
