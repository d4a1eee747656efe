import { Counter, collectDefaultMetrics, Gauge, Registry } from "prom-client";
import type { SteeringBudget } from "../../lens/index.js";
import { type CallMetrics, createCallMetrics } from "../../telemetry/index.js";
import type { ReplicaStatus, UpstreamPool } from "../../upstream/index.js";

/** The gateway's Prometheus metrics (served at GET /metrics). */
export interface GatewayMetrics {
  readonly registry: Registry;
  /** The per-request metrics (src/telemetry/metrics.ts), fed by the access log. */
  readonly calls: CallMetrics;
}

/**
 * A fresh registry (one per server, so tests can build several) with Node's default metrics, and
 * gauges read from `steering` when given: `acs_steering_bytes_in_flight` (decoded steering bytes
 * held now), `acs_steering_bytes_in_flight_peak` (the most held at once since start) and
 * `acs_steering_bytes_limit` (the process-wide bound). With ACS_WORKERS > 1 the peak and the limit
 * are each process's own: /metrics reads the most of the workers' (the limit, not workers × it);
 * the bytes in flight are summed.
 */
export function createMetrics(
  steering?: Pick<SteeringBudget, "inFlight" | "peak" | "processBytes">,
): GatewayMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  if (steering !== undefined) {
    const gauge = (name: string, help: string, read: () => number, aggregator: "sum" | "max" = "sum") =>
      new Gauge({
        name,
        help,
        registers: [registry],
        aggregator,
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
      "The most decoded steering tensor bytes held at once since start (one process: with several workers, the most of any worker).",
      () => steering.peak,
      "max",
    );
    gauge(
      "acs_steering_bytes_limit",
      "The most decoded steering tensor bytes all requests of one process may hold at once (ACS_STEERING_PROCESS_BYTES).",
      () => steering.processBytes,
      "max",
    );
  }
  return { registry, calls: createCallMetrics(registry) };
}

/**
 * The Budget ledger's gauges, read at each scrape: `acs_budget_settles_pending` (settles and late
 * charges the store failed to write, kept and written again: src/budget/README.md, "When the store
 * fails"; summed over workers) and `acs_budget_ledger_writable` (1 while the ledger can write, 0
 * while it cannot: /readyz is 503 meanwhile; with several workers the least of theirs).
 */
export function registerLedgerMetrics(
  registry: Registry,
  ledger: { readonly writable: boolean; readonly pendingSettles: number },
): void {
  new Gauge({
    name: "acs_budget_settles_pending",
    help: "Settles (and late charges) of Holds the Budget store failed to write, waiting to be written again.",
    registers: [registry],
    collect() {
      this.set(ledger.pendingSettles);
    },
  });
  new Gauge({
    name: "acs_budget_ledger_writable",
    help: "1 while the Budget ledger's store writes, 0 from a failed write until every pending settle is written.",
    registers: [registry],
    aggregator: "min",
    collect() {
      this.set(ledger.writable ? 1 : 0);
    },
  });
}

/** A model's replica pool, as the upstream metrics read it (src/upstream/pool). */
export interface PoolMetricsSource {
  readonly model: string;
  readonly pool: Pick<UpstreamPool, "replicas" | "failovers">;
}

/** A counter fed from a monotonic total read at each scrape: adds what was added since the last. */
function fromTotals(): (counter: Counter<string>, labels: Record<string, string>, total: number) => void {
  const seen = new Map<string, number>();
  return (counter, labels, total) => {
    const key = JSON.stringify(labels);
    counter.inc(labels, Math.max(0, total - (seen.get(key) ?? 0)));
    seen.set(key, total);
  };
}

/**
 * The replicas' metrics, read from the pools at each scrape: `acs_upstream_replica_up` and
 * `acs_upstream_replica_state` (starting, up, down; with ACS_WORKERS > 1 the most of the workers'
 * values, each worker having its own view of the replica, where every other series is summed),
 * `acs_upstream_replica_outstanding_requests`, `acs_upstream_replica_requests_total`, `acs_upstream_replica_errors_total` by kind (unreachable,
 * broken, unavailable, rejected, server_error, silent, health) and `acs_upstream_failovers_total` per
 * model. Labels: `model` (the model's id) and `replica` (its base URL).
 */
export function registerUpstreamMetrics(registry: Registry, sources: readonly PoolMetricsSource[]): void {
  const each = (fn: (model: string, r: ReplicaStatus) => void) => {
    for (const { model, pool } of sources) for (const r of pool.replicas()) fn(model, r);
  };
  // Every worker of ACS_WORKERS > 1 keeps its own view of each replica: the aggregated /metrics
  // reads 1 where any worker does (the replica gets that worker's requests), not the workers' count.
  new Gauge({
    name: "acs_upstream_replica_up",
    help: "1 while the replica is up (gets requests), else 0. With several workers: 1 while any worker sees it up.",
    labelNames: ["model", "replica"],
    registers: [registry],
    aggregator: "max",
    collect() {
      this.reset();
      each((model, r) => this.set({ model, replica: r.url }, r.state === "up" ? 1 : 0));
    },
  });
  new Gauge({
    name: "acs_upstream_replica_state",
    help: "1 for the replica's current state (starting, up, down), 0 for the others. With several workers: 1 for each state some worker sees.",
    labelNames: ["model", "replica", "state"],
    registers: [registry],
    aggregator: "max",
    collect() {
      this.reset();
      each((model, r) => {
        for (const state of ["starting", "up", "down"] as const) {
          this.set({ model, replica: r.url, state }, r.state === state ? 1 : 0);
        }
      });
    },
  });
  new Gauge({
    name: "acs_upstream_replica_outstanding_requests",
    help: "Requests sent to the replica and not finished.",
    labelNames: ["model", "replica"],
    registers: [registry],
    collect() {
      this.reset();
      each((model, r) => this.set({ model, replica: r.url }, r.outstanding));
    },
  });
  const requests = fromTotals();
  new Counter({
    name: "acs_upstream_replica_requests_total",
    help: "Requests sent to the replica (completions, tokenize, models).",
    labelNames: ["model", "replica"],
    registers: [registry],
    collect() {
      each((model, r) => requests(this, { model, replica: r.url }, r.requests));
    },
  });
  const errors = fromTotals();
  new Counter({
    name: "acs_upstream_replica_errors_total",
    help: "Failures of the replica by kind: unreachable, broken, unavailable, rejected, server_error, health.",
    labelNames: ["model", "replica", "kind"],
    registers: [registry],
    collect() {
      each((model, r) => {
        for (const [kind, n] of Object.entries(r.errors)) errors(this, { model, replica: r.url, kind }, n);
      });
    },
  });
  const failovers = fromTotals();
  new Counter({
    name: "acs_upstream_failovers_total",
    help: "Requests sent again to another replica after a failure before any output.",
    labelNames: ["model"],
    registers: [registry],
    collect() {
      for (const { model, pool } of sources) failovers(this, { model }, pool.failovers());
    },
  });
}
