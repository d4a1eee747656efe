// WorkerMetricsMemory: what the cluster's primary keeps of its workers' metrics, so that no counter
// of the aggregated /metrics goes back when a worker exits or misses a scrape. Real prom-client
// registries stand for the workers; the aggregate is prom-client's AggregatorRegistry, as in the
// primary.
import { AggregatorRegistry, Counter, Gauge, Histogram, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { cumulativePart, type MetricsJson, WorkerMetricsMemory } from "../../src/app/worker-metrics.js";

/** A worker's registry: a counter, a histogram and a gauge, as the gateway's metrics are. */
function workerRegistry() {
  const registry = new Registry();
  const requests = new Counter({
    name: "t_requests_total",
    help: "h",
    labelNames: ["route"],
    registers: [registry],
  });
  const duration = new Histogram({
    name: "t_duration_seconds",
    help: "h",
    buckets: [0.1, 1],
    registers: [registry],
  });
  const inFlight = new Gauge({ name: "t_in_flight", help: "h", registers: [registry] });
  return { registry, requests, duration, inFlight };
}

/** The value of each series in Prometheus text, by name and labels. */
async function aggregated(parts: MetricsJson[]): Promise<Map<string, number>> {
  const text = await AggregatorRegistry.aggregate(parts).metrics();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    const m = /^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m) out.set(m[1] as string, Number(m[2]));
  }
  return out;
}

/** Lets a fold (asynchronous) finish. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

describe("cumulativePart", () => {
  it("keeps counters and histograms, not gauges", async () => {
    const w = workerRegistry();
    w.requests.inc({ route: "/v1/completions" });
    w.duration.observe(0.5);
    w.inFlight.set(3);
    const names = cumulativePart(await w.registry.getMetricsAsJSON()).map((m) => m.name);
    expect(names.sort()).toEqual(["t_duration_seconds", "t_requests_total"]);
  });
});

describe("WorkerMetricsMemory", () => {
  it("an exited worker's counters stay in the sum; its gauges go", async () => {
    const memory = new WorkerMetricsMemory();
    const [a, b] = [workerRegistry(), workerRegistry()];
    a.requests.inc({ route: "/x" }, 5);
    a.duration.observe(0.05);
    a.inFlight.set(2);
    b.requests.inc({ route: "/x" }, 3);
    const first = [await a.registry.getMetricsAsJSON(), await b.registry.getMetricsAsJSON()];
    memory.answered(1, 0, first[0] as MetricsJson);
    memory.answered(2, 0, first[1] as MetricsJson);
    const before = await aggregated(memory.forScrape(first, []));
    expect(before.get('t_requests_total{route="/x"}')).toBe(8);
    expect(before.get("t_in_flight")).toBe(2);

    // Worker 1 exits; its successor has counted 1 since.
    memory.workerExited(1);
    const successor = workerRegistry();
    successor.requests.inc({ route: "/x" });
    b.requests.inc({ route: "/x" });
    const after = await aggregated(
      memory.forScrape(
        [await successor.registry.getMetricsAsJSON(), await b.registry.getMetricsAsJSON()],
        [],
      ),
    );
    expect(after.get('t_requests_total{route="/x"}')).toBe(5 + 1 + 4);
    expect(after.get("t_duration_seconds_count")).toBe(1);
    expect(after.get('t_duration_seconds_bucket{le="0.1"}')).toBe(1);
    expect(after.get("t_in_flight")).toBe(0);
  });

  it("a worker that misses a scrape counts as it last answered, counters only", async () => {
    const memory = new WorkerMetricsMemory();
    const [a, b] = [workerRegistry(), workerRegistry()];
    a.requests.inc({ route: "/x" }, 7);
    a.inFlight.set(4);
    b.requests.inc({ route: "/x" }, 2);
    memory.answered(1, 0, await a.registry.getMetricsAsJSON());
    const silentScrape = await aggregated(memory.forScrape([await b.registry.getMetricsAsJSON()], [1]));
    expect(silentScrape.get('t_requests_total{route="/x"}')).toBe(9);
    expect(silentScrape.get("t_in_flight")).toBe(0);
  });

  it("many exits are folded into one copy, and no scrape in between misses or doubles a count", async () => {
    const memory = new WorkerMetricsMemory();
    let expected = 0;
    for (let i = 1; i <= 20; i++) {
      const w = workerRegistry();
      w.requests.inc({ route: "/x" }, i);
      expected += i;
      memory.answered(1, i, await w.registry.getMetricsAsJSON());
      memory.workerExited(1);
      // Read before the fold has finished: the part is there unfolded.
      expect((await aggregated(memory.forScrape([], []))).get('t_requests_total{route="/x"}')).toBe(expected);
    }
    await settle();
    const parts = memory.forScrape([], []);
    expect(parts.length).toBeLessThanOrEqual(2);
    expect((await aggregated(parts)).get('t_requests_total{route="/x"}')).toBe(expected);
  });

  it("an answer to an older scrape, or an empty one, does not replace the one kept", async () => {
    const memory = new WorkerMetricsMemory();
    const w = workerRegistry();
    w.requests.inc({ route: "/x" }, 1);
    const older = await w.registry.getMetricsAsJSON();
    w.requests.inc({ route: "/x" }, 9);
    memory.answered(1, 6, await w.registry.getMetricsAsJSON());
    memory.answered(1, 5, older);
    memory.answered(1, 7, []);
    memory.workerExited(1);
    expect((await aggregated(memory.forScrape([], []))).get('t_requests_total{route="/x"}')).toBe(10);
  });

  it("a worker that exits before any scrape leaves nothing behind", async () => {
    const memory = new WorkerMetricsMemory();
    memory.workerExited(3);
    expect((await aggregated(memory.forScrape([], []))).size).toBe(0);
  });
});
