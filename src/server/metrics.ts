import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import type { SteeringBudget } from "../lens/index.js";

/** The gateway's Prometheus metrics (served at GET /metrics). */
export interface GatewayMetrics {
  readonly registry: Registry;
  /** Requests by surface (rest, connect, ops), route and HTTP status. */
  readonly requests: Counter<"surface" | "route" | "status">;
  /** Time to the end of the response, seconds, by surface and route. */
  readonly duration: Histogram<"surface" | "route">;
}

/**
 * A fresh registry (one per server, so tests can build several) with Node's default metrics, and
 * gauges read from `steering` when given: `acs_steering_bytes_in_flight` (decoded steering bytes
 * held now), `acs_steering_bytes_in_flight_peak` (the most held at once since start) and
 * `acs_steering_bytes_limit` (the process-wide bound).
 */
export function createMetrics(
  steering?: Pick<SteeringBudget, "inFlight" | "peak" | "processBytes">,
): GatewayMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  if (steering !== undefined) {
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({
        name,
        help,
        registers: [registry],
        collect() {
          this.set(read());
        },
      });
    gauge(
      "acs_steering_bytes_in_flight",
      "Decoded steering tensor bytes held by requests now.",
      () => steering.inFlight,
    );
    gauge(
      "acs_steering_bytes_in_flight_peak",
      "The most decoded steering tensor bytes held at once since start.",
      () => steering.peak,
    );
    gauge(
      "acs_steering_bytes_limit",
      "The most decoded steering tensor bytes all requests may hold at once.",
      () => steering.processBytes,
    );
  }
  return {
    registry,
    requests: new Counter({
      name: "acs_requests_total",
      help: "Requests answered, by surface, route and HTTP status.",
      labelNames: ["surface", "route", "status"],
      registers: [registry],
    }),
    duration: new Histogram({
      name: "acs_request_duration_seconds",
      help: "Time from request to the end of the response, seconds.",
      labelNames: ["surface", "route"],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900],
      registers: [registry],
    }),
  };
}
