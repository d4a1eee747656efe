// The cluster's /metrics, as the primary answers it: every listening worker's metrics aggregated
// (prom-client AggregatorRegistry), the counters and histograms of a worker that did not answer in
// time or has exited as it last answered (src/app/worker-metrics.ts: no counter of the
// aggregate goes back), plus the primary's own `acs_cluster_*`.
import { AggregatorRegistry, Counter, Gauge } from "prom-client";
import type { MetricsJson } from "../worker-metrics.js";
import type { ToWorker } from "./ipc.js";
import type { PendingScrape, Primary, Slot } from "./primary-state.js";

/** How long a scrape waits for the workers' answers before reading the rest as they last answered, ms. */
const SCRAPE_WAIT_MS = 5000;

/** Registers `acs_cluster_workers`, `acs_cluster_worker_restarts_total` and `..._timeouts_total`. */
export function registerClusterMetrics(primary: Primary): void {
  const registers = [primary.scrapes.registry];
  new Gauge({
    name: "acs_cluster_workers",
    help: "Gateway worker processes listening now (ACS_WORKERS).",
    registers,
    collect() {
      this.set(primary.slots.filter((s) => s.listening).length);
    },
  });
  new Counter({
    name: "acs_cluster_worker_restarts_total",
    help: "Gateway worker processes started again after one died.",
    registers,
    collect() {
      this.reset();
      this.inc(primary.restarts);
    },
  });

  new Counter({
    name: "acs_cluster_worker_timeouts_total",
    help: "Gateway worker processes killed after ACS_WORKER_TIMEOUT_MS without a report (their event loops stalled).",
    registers,
    collect() {
      this.reset();
      this.inc(primary.timeouts);
    },
  });
}

/**
 * Every listening worker's metrics, aggregated, plus the primary's own, as Prometheus text; the
 * counters and histograms of workers that did not answer within 5 s or have exited as they last
 * answered (WorkerMetricsMemory: no counter of the aggregate goes back).
 */
export function aggregate(primary: Primary): Promise<string> {
  const { slots, scrapes, logger } = primary;
  return new Promise((resolve, reject) => {
    const id = scrapes.nextScrape++;
    const live = slots.filter((s) => s.listening && s.worker?.isConnected());
    const entry: PendingScrape = {
      got: new Map<number, MetricsJson>(),
      waiting: new Set(live.map((s) => s.n)),
      // Read as they last answered: a worker whose channel closed before its 'exit' came, and
      // one that answered nothing (it failed to read its registry).
      silent: new Set(slots.filter((s) => s.listening && !s.worker?.isConnected()).map((s) => s.n)),
      done: () => {
        clearTimeout(timer);
        scrapes.pending.delete(id);
        const parts = scrapes.memory.forScrape(entry.got.values(), [...entry.waiting, ...entry.silent]);
        Promise.all([AggregatorRegistry.aggregate(parts).metrics(), scrapes.registry.metrics()]).then(
          ([workers, own]) => resolve(`${workers}${own}`),
          reject,
        );
      },
    };
    // A worker that does not answer within 5 s (stuck, or closing) is read as it last answered.
    const timer = setTimeout(() => {
      logger.warn({ workers: [...entry.waiting] }, "workers did not answer a metrics scrape in 5 s");
      entry.done();
    }, SCRAPE_WAIT_MS);
    scrapes.pending.set(id, entry);
    for (const s of live) s.worker?.send({ acs: "metrics", id } satisfies ToWorker);
    if (entry.waiting.size === 0) entry.done();
  });
}

/** A worker's answer to the metrics read `id` (its slot's worker now: the caller checks). */
export function metricsAnswered(primary: Primary, slot: Slot, id: number, metrics: MetricsJson): void {
  // Also a late answer, after its scrape went on without it: the newest this worker counted.
  primary.scrapes.memory.answered(slot.n, id, metrics);
  const entry = primary.scrapes.pending.get(id);
  if (entry === undefined || !entry.waiting.delete(slot.n)) return;
  if (metrics.length > 0) entry.got.set(slot.n, metrics);
  else entry.silent.add(slot.n);
  if (entry.waiting.size === 0) entry.done();
}

/** A worker's aggregate for its /metrics (the answer to its `scrape`), or the failure's text. */
export function answerScrape(primary: Primary, slot: Slot, id: number): void {
  aggregate(primary).then(
    (text) => slot.worker?.send({ acs: "scrape", id, text } satisfies ToWorker),
    (err: unknown) => slot.worker?.send({ acs: "scrape", id, error: String(err) } satisfies ToWorker),
  );
}

/**
 * `slot`'s worker exited: its last answer is kept for the scrapes to come; a scrape still waiting
 * drops the answer it got from it, which that memory now counts (else twice).
 */
export function metricsWorkerExited(primary: Primary, slot: Slot): void {
  primary.scrapes.memory.workerExited(slot.n);
  for (const entry of primary.scrapes.pending.values()) {
    entry.got.delete(slot.n);
    if (entry.waiting.delete(slot.n) && entry.waiting.size === 0) entry.done();
  }
}
