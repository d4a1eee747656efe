import { Counter, collectDefaultMetrics, Histogram, Registry } from "prom-client";

/** The gateway's Prometheus metrics (served at GET /metrics). */
export interface GatewayMetrics {
  readonly registry: Registry;
  /** Requests by surface (rest, connect, ops), route and HTTP status. */
  readonly requests: Counter<"surface" | "route" | "status">;
  /** Time to the end of the response, seconds, by surface and route. */
  readonly duration: Histogram<"surface" | "route">;
}

/** A fresh registry (one per server, so tests can build several) with Node's default metrics. */
export function createMetrics(): GatewayMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
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
