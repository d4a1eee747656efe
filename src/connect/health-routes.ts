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

/** Services the health protocol reports on for the gateway as a whole ("" is the server). */
const gatewayServices = ["", CompletionsService.typeName];

/**
 * Registers grpc.health.v1.Health (Check, Watch, List) for load balancers and Kubernetes gRPC
 * probes. The server ("") and `acs.v1.CompletionsService` are SERVING when `isReady()`; each model
 * is a service named by its id, SERVING while it serves (`modelStatus`, e.g. one replica up) and
 * the gateway is ready; else NOT_SERVING. An unknown service name is NOT_FOUND on Check and
 * SERVICE_UNKNOWN on Watch (per the protocol). Watch sends the current status and then each
 * change, polled every `pollMs`.
 */
export function createHealthRoutes(
  isReady: () => boolean,
  modelStatus: () => ReadonlyArray<{ readonly id: string; readonly serving: boolean }> = () => [],
  pollMs = 1000,
): (router: ConnectRouter) => void {
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
            services().map((s) => [s, create(HealthCheckResponseSchema, { status: status(s) })]),
          ),
        });
      },
    });
  };
}
