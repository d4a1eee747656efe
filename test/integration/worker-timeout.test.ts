// ACS_WORKER_TIMEOUT_MS: the cluster's primary kills a worker, listening or still starting, it has
// not heard from for that long (its event loop stalled; here stopped with SIGSTOP) and starts
// another in its slot, as gunicorn's worker timeout does; a primary that was itself held up kills
// nobody, since the workers' reports waited unread in its channels. A real gateway (src/main.ts, ACS_WORKERS=2) with
// the embedded engine, keys off; the primary's counters read on its ops port.
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { metricSeries, metricTotal } from "../helpers/metrics.js";
import { workerPidsOf } from "../helpers/proc.js";
import { freePort, waitForOk } from "../helpers/processes.js";

/** The shortest ACS_WORKER_TIMEOUT_MS: far above an idle worker's gap between reports (≤ 1.25 s). */
const TIMEOUT_MS = 10_000;

/** One completion on a new connection (either worker may take it): its status. */
async function complete(url: string): Promise<number> {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", connection: "close" },
    body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 2, temperature: 0 }),
  });
  await res.arrayBuffer();
  return res.status;
}

describe("ACS_WORKER_TIMEOUT_MS with ACS_WORKERS=2", () => {
  let primary: ChildProcess;
  let url: string;
  let ops: string;
  const stopped: number[] = [];
  /** The gateway's log lines (every process's: the primary's and the workers'), parsed. */
  const logs: { msg?: string; workerPid?: number }[] = [];

  beforeAll(async () => {
    const [port, opsPort] = [await freePort(), await freePort()];
    url = `http://127.0.0.1:${port}`;
    ops = `http://127.0.0.1:${opsPort}`;
    primary = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      env: {
        ...process.env,
        ACS_WORKERS: "2",
        ACS_WORKER_TIMEOUT_MS: String(TIMEOUT_MS),
        ACS_ENGINE_PRESET: "tiny",
        PORT: String(port),
        ACS_OPS_PORT: String(opsPort),
        // The primary's "worker starting" line (debug) says when a worker has reported.
        ACS_LOG_LEVEL: "debug",
        // SIGTERM (the last case): a healthy worker drains for 1 s; the shutdown's own time limit
        // (drain + grace + 15 s) is over an hour, so that only the watchdog can end a stalled one.
        ACS_DRAIN_DELAY_MS: "1000",
        ACS_SHUTDOWN_GRACE_MS: "3600000",
      },
      stdio: ["ignore", "pipe", "ignore"],
    });
    createInterface({ input: primary.stdout as NodeJS.ReadableStream }).on("line", (line) => {
      try {
        logs.push(JSON.parse(line));
      } catch {
        // not a log line
      }
    });
    await waitForOk(`${url}/readyz`);
    await until(async () => (await metricTotal(ops, "acs_cluster_workers")) === 2, "both workers listen", 50);
  });

  afterAll(() => {
    for (const pid of stopped) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    for (const pid of workerPidsOf(primary?.pid ?? 0)) process.kill(pid, "SIGKILL");
    primary?.kill("SIGKILL");
  });

  it("a worker whose event loop stopped is killed and started again in its slot; the other is untouched; no counter on /metrics goes back", async () => {
    // Both workers have answered completions, so that the stopped one's counts are missed if lost.
    await until(async () => {
      await Promise.all(Array.from({ length: 4 }, () => complete(url)));
      const perWorker = [...(await metricSeries(ops, "acs_worker_requests_total")).values()];
      return perWorker.length === 2 && perWorker.every((n) => n > 0);
    }, "both workers have answered requests");
    const requestsBefore = await metricSeries(ops, "acs_requests_total");
    const [victim, other] = workerPidsOf(primary.pid ?? 0) as [number, number];
    const restartsBefore = await metricTotal(ops, "acs_cluster_worker_restarts_total");
    expect(await metricTotal(ops, "acs_cluster_worker_timeouts_total")).toBe(0);
    process.kill(victim, "SIGSTOP");
    stopped.push(victim);
    // A scrape while it is stopped: the primary waits 5 s for its answer, then reads its counters
    // as it last answered (without them the sums would drop: a counter reset to Prometheus).
    const requestsStopped = await metricSeries(ops, "acs_requests_total");
    for (const [labels, n] of requestsBefore)
      expect(requestsStopped.get(labels), labels).toBeGreaterThanOrEqual(n);
    // Killed (gone from the primary's children), and a new worker in its place.
    await until(
      () => {
        const now = workerPidsOf(primary.pid ?? 0);
        return !now.includes(victim) && now.length === 2;
      },
      "the stopped worker replaced",
      50,
    );
    expect(workerPidsOf(primary.pid ?? 0)).toContain(other);
    await until(
      async () => (await metricTotal(ops, "acs_cluster_workers")) === 2,
      "two workers listen again",
      50,
    );
    expect(await metricTotal(ops, "acs_cluster_worker_timeouts_total")).toBe(1);
    expect(await metricTotal(ops, "acs_cluster_worker_restarts_total")).toBe(restartsBefore + 1);
    // Replaced, it is counted as it last answered.
    const requestsReplaced = await metricSeries(ops, "acs_requests_total");
    for (const [labels, n] of requestsBefore)
      expect(requestsReplaced.get(labels), labels).toBeGreaterThanOrEqual(n);
    // Both serve: new connections, whichever worker takes each.
    const statuses = await Promise.all(Array.from({ length: 6 }, () => complete(url)));
    expect(statuses).toEqual([200, 200, 200, 200, 200, 200]);
  });

  it("a primary held up now and then still kills a stuck worker: only the time it was held up is not counted", async () => {
    const [victim] = workerPidsOf(primary.pid ?? 0) as [number, number];
    const timeoutsBefore = await metricTotal(ops, "acs_cluster_worker_timeouts_total");
    process.kill(victim, "SIGSTOP");
    stopped.push(victim);
    // The primary stopped 2.5 s of every 4 s: each stop is late enough to be discounted, and the
    // worker's silence grows by the 1.5 s between them. (Once, each stop wiped it out: never killed.)
    while (workerPidsOf(primary.pid ?? 0).includes(victim)) {
      process.kill(primary.pid ?? 0, "SIGSTOP");
      try {
        await sleep(2500);
      } finally {
        process.kill(primary.pid ?? 0, "SIGCONT");
      }
      await sleep(1500);
    }
    await until(
      async () => (await metricTotal(ops, "acs_cluster_workers")) === 2,
      "two workers listen again",
      50,
    );
    expect(await metricTotal(ops, "acs_cluster_worker_timeouts_total")).toBe(timeoutsBefore + 1);
  });

  it("a primary held up past the timeout kills no worker: their reports waited in its channels; /metrics on the main port is 503 meanwhile", async () => {
    const before = workerPidsOf(primary.pid ?? 0);
    expect(before).toHaveLength(2);
    const timeoutsBefore = await metricTotal(ops, "acs_cluster_worker_timeouts_total");
    process.kill(primary.pid ?? 0, "SIGSTOP");
    let scrape: Promise<Response> | undefined;
    try {
      // A worker asks the primary for every worker's metrics and waits 10 s: not its own alone
      // instead (lower than the sums before: counter resets to Prometheus).
      scrape = fetch(`${url}/metrics`);
      await sleep(TIMEOUT_MS + 2000);
    } finally {
      process.kill(primary.pid ?? 0, "SIGCONT");
    }
    const res = await scrape;
    expect(res.status).toBe(503);
    const body = (await res.json()) as { error: { code: string; type: string }; request_id: string };
    expect(body.error.code).toBe("upstream_unavailable");
    expect(body.error.type).toBe("server_error");
    expect(body.request_id).toBe(res.headers.get("x-request-id"));
    // Its watchdog runs every second: give it several turns to (wrongly) act.
    await sleep(3000);
    expect(workerPidsOf(primary.pid ?? 0)).toEqual(before);
    expect(await metricTotal(ops, "acs_cluster_worker_timeouts_total")).toBe(timeoutsBefore);
    expect(await complete(url)).toBe(200);
  });
  it("both workers stopped: replaced one at a time, so a connection waiting in the port's queue is served", async () => {
    const pids = workerPidsOf(primary.pid ?? 0);
    expect(pids).toHaveLength(2);
    for (const pid of pids) process.kill(pid, "SIGSTOP");
    stopped.push(...pids);
    // Accepted by nobody until a replacement listens (the port's queue is the primary's socket's).
    // Killed both at once, no process would hold the socket for a moment: it would close, and
    // this connection would be reset.
    const waiting = complete(url);
    await until(() => workerPidsOf(primary.pid ?? 0).every((p) => !pids.includes(p)), "both replaced", 50);
    expect(await waiting).toBe(200);
    await until(
      async () => (await metricTotal(ops, "acs_cluster_workers")) === 2,
      "two workers listen again",
      50,
    );
  });

  /**
   * Kills a worker; resolves with its replacement's pid as soon as that runs Node (exec'd: its
   * environment has the worker's settings). Stopped between its fork and its exec, it would hold
   * the primary in uv_spawn.
   */
  async function replaceOne(victim?: number): Promise<number> {
    const before = workerPidsOf(primary.pid ?? 0);
    expect(before).toHaveLength(2);
    process.kill(victim ?? (before[0] as number), "SIGKILL");
    let starting = 0;
    const execed = (pid: number) => {
      try {
        return readFileSync(`/proc/${pid}/environ`, "latin1").includes("ACS_CLUSTER_WORKER=");
      } catch {
        return false;
      }
    };
    await until(
      () => {
        starting = workerPidsOf(primary.pid ?? 0).find((p) => !before.includes(p) && execed(p)) ?? 0;
        return starting !== 0;
      },
      "a replacement started",
      5,
    );
    return starting;
  }

  /** Waits until the watchdog has killed `pid` (`what`) and two workers listen again: one timeout more. */
  async function killedAndReplaced(pid: number, what: string, timeoutsBefore: number): Promise<void> {
    await until(() => !workerPidsOf(primary.pid ?? 0).includes(pid), what, 50);
    await until(
      async () => (await metricTotal(ops, "acs_cluster_workers")) === 2,
      "two workers listen again",
      50,
    );
    expect(await metricTotal(ops, "acs_cluster_worker_timeouts_total")).toBe(timeoutsBefore + 1);
  }

  it("a worker stopped while starting, after its first report, before it listens, is killed and started again", async () => {
    const timeoutsBefore = await metricTotal(ops, "acs_cluster_worker_timeouts_total");
    // Stopped between its first report and its listening (a second or more under tsx); if it
    // listened first, it is let go and another one tried.
    let starting = 0;
    for (let attempt = 1; ; attempt++) {
      starting = await replaceOne();
      await until(
        () => logs.some((l) => l.msg === "worker starting" && l.workerPid === starting),
        "the replacement reports",
        5,
      );
      process.kill(starting, "SIGSTOP");
      stopped.push(starting);
      await sleep(200); // a "listening" it sent before it stopped is read by then
      if ((await metricTotal(ops, "acs_cluster_workers")) === 1) break;
      process.kill(starting, "SIGCONT");
      expect(attempt, "a replacement stopped before it listened").toBeLessThan(5);
    }
    // A starting worker gets twice the timeout (its modules are evaluated in long synchronous
    // steps): still there past one.
    await sleep(TIMEOUT_MS + 2000);
    expect(workerPidsOf(primary.pid ?? 0)).toContain(starting);
    await killedAndReplaced(starting, "the worker stopped while starting is killed", timeoutsBefore);
    const statuses = await Promise.all(Array.from({ length: 4 }, () => complete(url)));
    expect(statuses).toEqual([200, 200, 200, 200]);
  });

  it("a worker held up before its first report (Node still starting: a starved CPU) gets four times the timeout", async () => {
    const timeoutsBefore = await metricTotal(ops, "acs_cluster_worker_timeouts_total");
    const starting = await replaceOne();
    // Stopped at once: Node has not loaded the gateway yet (its first report comes ~0.8 s after
    // the fork under tsx).
    process.kill(starting, "SIGSTOP");
    stopped.push(starting);
    expect(logs.some((l) => l.msg === "worker starting" && l.workerPid === starting)).toBe(false);
    // Past the limit of a worker that has reported (twice the timeout): still there.
    await sleep(2 * TIMEOUT_MS + 2000);
    expect(workerPidsOf(primary.pid ?? 0)).toContain(starting);
    await killedAndReplaced(starting, "killed after four times the timeout", timeoutsBefore);
    const line = logs.find((l) => l.workerPid === starting && l.msg?.startsWith("worker sent no report"));
    expect(line?.msg).toBe(
      "worker sent no report within four times ACS_WORKER_TIMEOUT_MS of its fork (stuck before the gateway's code ran); killing it and starting another in its place",
    );
  });

  it("a worker that dies young, even after it listened, is started again after a delay that doubles", async () => {
    /** The primary's line for the worker `pid` that died: how long it lived, the delay it chose. */
    const exitOf = (pid: number) =>
      logs.find((l) => l.workerPid === pid && l.msg === "worker exited; starting another in its place") as
        | { livedMs: number; listened: boolean; restartInMs: number }
        | undefined;
    const exits: { livedMs: number; listened: boolean; restartInMs: number }[] = [];
    let victim = await replaceOne();
    for (let i = 0; i < 3; i++) {
      const young = victim;
      await until(
        () => logs.some((l) => l.msg === "worker listening" && l.workerPid === young),
        "the replacement listens",
        5,
      );
      // Killed at once after it listens: within 5 s of its start on an idle machine.
      victim = await replaceOne(young);
      await until(() => exitOf(young) !== undefined, "its restart is logged", 5);
      exits.push(exitOf(young) as (typeof exits)[number]);
    }
    expect(exits.every((e) => e.listened)).toBe(true);
    // The delay doubles from 0.1 s while the workers die within 5 s of their start (a worker that
    // lived longer, on a loaded machine, takes it back to 0.1 s); it was 0.1 s each time once.
    // (The first one's delay depends on the deaths before it.)
    const expected = exits.map((e, k) => {
      const before = exits[k - 1];
      if (before === undefined) return e.restartInMs;
      if (e.livedMs >= 5000) return 100;
      return before.livedMs < 5000 ? Math.min(before.restartInMs * 2, 10_000) : 100;
    });
    expect(exits.map((e) => e.restartInMs)).toEqual(expected);
    expect(exits.filter((e) => e.livedMs < 5000).length, "workers killed young").toBeGreaterThanOrEqual(2);
    await until(
      async () => (await metricTotal(ops, "acs_cluster_workers")) === 2,
      "two workers listen again",
      50,
    );
  });

  it("SIGTERM with a worker stopped: /readyz there is 503 at once, the watchdog kills the stalled worker, the primary exits 1", async () => {
    const [victim, healthy] = workerPidsOf(primary.pid ?? 0) as [number, number];
    const exited = new Promise<number | null>((resolve) => primary.once("exit", (code) => resolve(code)));
    process.kill(victim, "SIGSTOP");
    stopped.push(victim);
    primary.kill("SIGTERM");
    // The healthy worker drains (1 s) and exits; the stopped one's last report said "ready", a
    // few seconds ago. The gateway is closing: not ready, whatever that report said.
    await until(() => !workerPidsOf(primary.pid ?? 0).includes(healthy), "the healthy worker exited", 50);
    const ready = await fetch(`${ops}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { status: string }).status).toBe("not_ready");
    // Without the watchdog during the close, the primary would wait for the stopped worker past
    // the hour of the shutdown's own limit.
    expect(await exited).toBe(1);
    expect(workerPidsOf(primary.pid ?? 0)).toEqual([]);
  });
});
