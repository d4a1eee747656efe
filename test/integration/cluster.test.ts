// ACS_WORKERS=2: a real primary (src/main.ts) with two workers on one port, the embedded engine
// started once by the primary, keys on in one SQLite file. Requests reach both workers; a small
// Budget is never overspent across them and no Hold is left open; /metrics sums both (a
// process-wide limit reads as it is); a worker that dies is started again, its counts kept in
// /metrics; SIGTERM to the primary ends every process.
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { Agent, fetch as undiciFetch } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { until } from "../helpers/hang-guard.js";
import { metricSeries } from "../helpers/metrics.js";
import { childrenOf, tcpSocketsOnPort, workerPidsOf } from "../helpers/proc.js";
import { freePort, startTs, waitForOk } from "../helpers/processes.js";
import { holdsByWorker } from "../helpers/sqlite-holds.js";

const dir = mkdtempSync(join(tmpdir(), "acs-cluster-"));
const dbPath = join(dir, "acs.db");
let primary: ChildProcess;
let url: string;
let admin: BudgetLedger;
const STEERING_PROCESS_BYTES = 64 * 1024 * 1024;

/** The primary's worker processes. */
function workerPids(): number[] {
  return workerPidsOf(primary.pid ?? 0);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The value of each series of `name` on /metrics, by its label text (`""` without labels). */
const series = (name: string) => metricSeries(url, name);

/** acs_cluster_worker_restarts_total; a scrape on a kept-alive connection to a dead worker: -1. */
async function restarts(): Promise<number> {
  return (
    (await series("acs_cluster_worker_restarts_total").catch(() => new Map<string, number>())).get("") ?? -1
  );
}

/** acs_cluster_workers; a scrape on a kept-alive connection to a dead worker: -1. */
async function workersListening(): Promise<number> {
  return (await series("acs_cluster_workers").catch(() => new Map<string, number>())).get("") ?? -1;
}

beforeAll(async () => {
  admin = await createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 });
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  primary = startTs(["src/main.ts"], {
    ACS_WORKERS: "2",
    ACS_DB: dbPath,
    ACS_ENGINE_PRESET: "tiny",
    PORT: String(port),
    ACS_LOG_LEVEL: "warn",
    ACS_STEERING_PROCESS_BYTES: String(STEERING_PROCESS_BYTES),
  });
  await waitForOk(`${url}/healthz`);
  // Both workers listen (the primary counts them).
  await until(async () => (await series("acs_cluster_workers")).get("") === 2, "two workers listen");
});

afterAll(async () => {
  primary?.kill("SIGKILL");
  for (const pid of workerPids()) process.kill(pid, "SIGKILL");
  await admin?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Completions answered on /v1/completions, over all workers, as /metrics reports them. */
async function completionsOnMetrics(): Promise<number> {
  let n = 0;
  for (const [labels, v] of await series("acs_requests_total")) {
    if (labels.includes('route="/v1/completions"')) n += v;
  }
  return n;
}

// vLLM's ignore_eos (every request uses its whole max_tokens) rides along in the body.
const body = { model: "tiny", prompt: "Hi", max_tokens: 10, temperature: 0, ignore_eos: true };

describe("ACS_WORKERS=2", () => {
  it("requests land on both workers; /metrics sums the two", async () => {
    const { id, key } = await admin.createKey({ budgetTokens: 1_000_000 });
    // A connection per request (pipelining 0: none kept alive): a connection stays with the worker
    // that accepted it from the shared socket, so four kept-alive connections could all be one
    // worker's.
    const fresh = new Agent({ pipelining: 0 });
    const client = new OpenAI({
      apiKey: key,
      baseURL: `${url}/v1`,
      maxRetries: 0,
      fetch: ((u: string, init: RequestInit) =>
        undiciFetch(u, { ...(init as object), dispatcher: fresh })) as unknown as typeof fetch,
    });
    const before = await completionsOnMetrics();
    let sent = 0;
    await until(async () => {
      await Promise.all(Array.from({ length: 4 }, () => client.completions.create(body)));
      sent += 4;
      const by = holdsByWorker(dbPath, id);
      return (by.w1 ?? 0) > 0 && (by.w2 ?? 0) > 0;
    }, "both workers place Holds");
    await fresh.close();
    const by = holdsByWorker(dbPath, id);
    expect(Object.keys(by).sort()).toEqual(["w1", "w2"]);
    expect((by.w1 ?? 0) + (by.w2 ?? 0)).toBe(sent);
    // Each worker counts only what it answered: the aggregate is the sum of both.
    expect((await completionsOnMetrics()) - before).toBe(sent);
    const perWorker = await series("acs_worker_requests_total");
    expect([...perWorker.keys()].sort()).toEqual(['{worker="1"}', '{worker="2"}']);
    for (const n of perWorker.values()) expect(n).toBeGreaterThan(0);
    // A replica's state is each worker's view of one thing: 1 (up), not one per worker.
    const up = await series("acs_upstream_replica_up");
    expect(up.size).toBe(1);
    expect([...up.values()]).toEqual([1]);
    const state = await series("acs_upstream_replica_state");
    expect(
      [...state.entries()].filter(([labels]) => labels.includes('state="up"')).map(([, v]) => v),
    ).toEqual([1]);
  });

  it("acs_steering_bytes_limit reads the process-wide limit, not the sum of the workers'", async () => {
    const limit = await series("acs_steering_bytes_limit");
    // ACS_STEERING_PROCESS_BYTES: every worker has the same one.
    expect([...limit.entries()]).toEqual([["", STEERING_PROCESS_BYTES]]);
    const peak = (await series("acs_steering_bytes_in_flight_peak")).get("") ?? -1;
    expect(peak).toBeGreaterThanOrEqual(0);
    expect(peak).toBeLessThanOrEqual(STEERING_PROCESS_BYTES);
  });

  it("a small Budget is never overspent across the workers; no Hold left open", async () => {
    const budget = 120;
    const { id, key } = await admin.createKey({ budgetTokens: budget });
    const client = new OpenAI({ apiKey: key, baseURL: `${url}/v1`, maxRetries: 0 });
    const outcomes = await Promise.all(
      Array.from({ length: 40 }, () =>
        client.completions.create(body).then(
          (r) => ({ charged: r.usage?.total_tokens ?? Number.NaN, code: undefined }),
          (err: unknown) => ({ charged: 0, code: (err as { code?: string }).code }),
        ),
      ),
    );
    const served = outcomes.filter((o) => o.code === undefined);
    const refused = outcomes.filter((o) => o.code !== undefined);
    expect(refused.every((o) => o.code === "insufficient_quota")).toBe(true);
    expect(served.length).toBeGreaterThan(0);
    expect(refused.length).toBeGreaterThan(0); // the Budget fits fewer than 40 of them
    const charged = served.reduce((a, o) => a + o.charged, 0);
    const usage = await admin.usage(id);
    expect(usage.spentTokens).toBe(charged);
    expect(usage.spentTokens).toBeLessThanOrEqual(budget);
    expect(usage.openHolds).toBe(0);
    expect(usage.heldTokens).toBe(0);
    const by = holdsByWorker(dbPath, id);
    expect(Object.values(by).reduce((a, n) => a + n, 0)).toBe(served.length);
  });

  it("a worker SIGKILLed under load: every request in flight ends, answered or reset; the primary holds no connection", async () => {
    const { key } = await admin.createKey({ budgetTokens: 1_000 });
    const restartsBefore = await restarts();
    const statuses: number[] = [];
    let inFlight = 0;
    let running = true;
    // A new connection per request, as many callers make them: some are in the dead worker's
    // accept queue or being answered by it when it dies.
    const once = () =>
      new Promise<void>((resolve) => {
        inFlight++;
        let ended = false;
        const end = (status?: number) => {
          if (ended) return;
          ended = true;
          inFlight--;
          // A reset (no status) is what a caller of a worker that died gets.
          if (status !== undefined) statuses.push(status);
          resolve();
        };
        const req = request(
          `${url}/v1/models`,
          { agent: false, headers: { authorization: `Bearer ${key}`, connection: "close" } },
          (res) => {
            res.on("error", () => end());
            res.on("end", () => end(res.statusCode));
            res.resume();
          },
        );
        req.on("error", () => end());
        req.end();
      });
    const loops = Array.from({ length: 8 }, async () => {
      while (running) await once();
    });
    await until(() => statuses.length >= 100, "100 answers before the kill");
    const [victim] = workerPids();
    expect(victim).toBeDefined();
    process.kill(victim as number, "SIGKILL");
    await until(async () => (await restarts()) === restartsBefore + 1, "the primary counts a restart");
    await until(async () => (await workersListening()) === 2, "two workers listen again");
    const atRestart = statuses.length;
    await until(() => statuses.length >= atRestart + 100, "100 answers after the restart");
    running = false;
    // Under node:cluster's round robin one of them waited here for good: a connection the
    // primary had handed to the worker that died, never answered, never closed.
    await until(() => inFlight === 0, "every request in flight when the worker died ends");
    await Promise.all(loops);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    // The primary holds the shared listening socket (state 0A), and no caller's connection.
    const held = tcpSocketsOnPort(primary.pid ?? 0, Number(new URL(url).port));
    expect(held.filter((s) => s.state !== "0A")).toEqual([]);
  });

  it("starts a worker again when one dies; no counter on /metrics goes back", async () => {
    // Both workers have answered requests (new connections: either worker may take each), so
    // whichever dies takes counts with it.
    await until(async () => {
      await Promise.all(
        Array.from({ length: 4 }, () =>
          fetch(`${url}/v1/models`, { headers: { connection: "close" } }).then((r) => r.arrayBuffer()),
        ),
      );
      const perWorker = [...(await series("acs_worker_requests_total")).values()];
      return perWorker.length === 2 && perWorker.every((n) => n > 0);
    }, "both workers have answered requests");
    // This scrape is the last the primary reads from the worker that dies.
    const requestsBefore = await series("acs_requests_total");
    const perWorkerBefore = await series("acs_worker_requests_total");
    const [victim] = workerPids();
    expect(victim).toBeDefined();
    const restartsBefore = await restarts();
    process.kill(victim as number, "SIGKILL");
    await until(async () => (await restarts()) === restartsBefore + 1, "the primary counts a restart");
    await until(async () => (await workersListening()) === 2, "two workers listen again");
    const now = workerPids();
    expect(now).toHaveLength(2);
    expect(now).not.toContain(victim);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    // The dead worker's counts stay in the sums (a drop would read as a counter reset in
    // Prometheus): every series is at least what it was, each worker's too.
    const requestsAfter = await series("acs_requests_total");
    for (const [labels, n] of requestsBefore)
      expect(requestsAfter.get(labels), labels).toBeGreaterThanOrEqual(n);
    const perWorkerAfter = await series("acs_worker_requests_total");
    for (const [labels, n] of perWorkerBefore)
      expect(perWorkerAfter.get(labels), labels).toBeGreaterThanOrEqual(n);
  });

  it("SIGTERM to the primary: every worker closes, the engine stops, the primary exits 0", async () => {
    const children = childrenOf(primary.pid ?? 0);
    expect(children.length).toBe(3); // two workers and the engine
    const exited = new Promise<number | null>((resolve) => primary.once("exit", resolve));
    primary.kill("SIGTERM");
    expect(await exited).toBe(0);
    await until(() => children.every((pid) => !alive(pid)), "every child process is gone");
  });
});
