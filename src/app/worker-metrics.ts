// What the cluster's primary keeps of its workers' metrics, so that the counters of the aggregated
// /metrics never go back when a worker dies, is replaced or does not answer a scrape in time.
import { AggregatorRegistry, type Registry } from "prom-client";

/** One registry's metrics as JSON (`Registry.getMetricsAsJSON`), what a worker sends the primary. */
export type MetricsJson = Awaited<ReturnType<Registry["getMetricsAsJSON"]>>;

/**
 * The counters and histograms of `metrics` that the aggregate sums (prom-client's `sum`
 * aggregator, every counter and histogram of the gateway's): the series that only grow while a
 * process lives. Gauges (a worker's requests in flight, its heap), summaries and metrics
 * aggregated otherwise are left out: a process that is gone or silent has no current value.
 */
export function cumulativePart(metrics: MetricsJson): MetricsJson {
  return metrics.filter((m) => {
    const type = String(m.type);
    return (type === "counter" || type === "histogram") && (m.aggregator ?? "sum") === "sum";
  });
}

/**
 * The primary's memory of its workers' metrics (Prometheus counters must not decrease: a sum that
 * drops when one worker's part goes missing reads as a counter reset, and `rate()` then counts
 * the whole remaining sum as new). Per slot, the last metrics its current worker answered a scrape
 * with; and the cumulative part of the last answer of every worker that has exited. A scrape sums
 * the workers' answers, the cumulative part of the last answer of each worker that did not answer
 * in time (stalled, or stopped), and that of every exited worker. So each counter's aggregate is
 * monotone from one scrape to the next; what a worker counted after its last answered scrape is
 * lost with it, as a single process's counts since its last scrape are lost when it dies.
 */
export class WorkerMetricsMemory {
  /** By slot: the last metrics its current worker answered a scrape with, and that scrape's id. */
  private readonly last = new Map<number, { readonly scrape: number; readonly metrics: MetricsJson }>();
  /** The cumulative parts of exited workers, folded into one. */
  private exited: MetricsJson = [];
  /** Exited workers' cumulative parts not yet folded into {@link exited}. */
  private pending: MetricsJson[] = [];

  /**
   * Slot `slot`'s worker answered scrape `scrape` (the primary's ids grow) with `metrics`. An empty
   * answer (a failed read), or one to an older scrape than the answer kept (a worker reads its
   * registry asynchronously: two answers may cross), is ignored.
   */
  answered(slot: number, scrape: number, metrics: MetricsJson): void {
    if (metrics.length === 0) return;
    const kept = this.last.get(slot);
    if (kept === undefined || kept.scrape < scrape) this.last.set(slot, { scrape, metrics });
  }

  /**
   * Slot `slot`'s worker has exited: the cumulative part of its last answer is kept for every
   * later scrape (a scrape still waiting must then drop that worker's answer: it is counted here).
   */
  workerExited(slot: number): void {
    const last = this.last.get(slot);
    this.last.delete(slot);
    if (last === undefined) return;
    this.pending.push(cumulativePart(last.metrics));
    this.fold();
  }

  /**
   * What one scrape aggregates (prom-client `AggregatorRegistry.aggregate`): `answers` (the
   * workers that answered it), the cumulative part of the last answer of each slot in `silent`
   * (listening workers that did not answer in time), and that of every exited worker.
   */
  forScrape(answers: Iterable<MetricsJson>, silent: Iterable<number>): MetricsJson[] {
    const out = [...answers];
    for (const slot of silent) {
      const last = this.last.get(slot);
      if (last !== undefined) out.push(cumulativePart(last.metrics));
    }
    out.push(this.exited, ...this.pending);
    return out;
  }

  /**
   * Folds the pending parts into one, so that memory stays one copy of the series however many
   * workers have exited. The swap happens at once when the fold is ready; until then, and if
   * another fold got there first, scrapes read the parts unfolded.
   */
  private fold(): void {
    const base = this.exited;
    const parts = [...this.pending];
    AggregatorRegistry.aggregate([base, ...parts])
      .getMetricsAsJSON()
      .then(
        (folded) => {
          if (this.exited !== base) return;
          this.exited = folded;
          this.pending.splice(0, parts.length);
        },
        () => undefined, // unfolded parts are still read as they are
      );
  }
}
