// ACS_OPS_PORT: GET /healthz, /readyz and /metrics on a port of their own, served by the single
// process (ACS_WORKERS=1) or by the cluster's primary (ACS_WORKERS=2), the same answers as on the
// main port; anything else there is the error envelope; with two workers, /metrics sums both, and
// workers stopped (SIGSTOP) are neither live nor ready there; SIGTERM makes /readyz 503 during the
// drain. A real gateway (src/main.ts) with the embedded engine, keys off.
import type { ChildProcess } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { metricTotal } from "../helpers/metrics.js";
import { workerPidsOf } from "../helpers/proc.js";
import { freePort, startTs, waitForOk } from "../helpers/processes.js";

describe.each([1, 2])("ACS_OPS_PORT with ACS_WORKERS=%i", (workers) => {
  let gateway: ChildProcess;
  let url: string;
  let ops: string;

  beforeAll(async () => {
    const [port, opsPort] = [await freePort(), await freePort()];
    url = `http://127.0.0.1:${port}`;
    ops = `http://127.0.0.1:${opsPort}`;
    gateway = startTs(["src/main.ts"], {
      ACS_WORKERS: String(workers),
      // A case stops both workers on purpose; the primary's watchdog has its own (worker-timeout).
      ACS_WORKER_TIMEOUT_MS: "0",
      ACS_ENGINE_PRESET: "tiny",
      PORT: String(port),
      ACS_OPS_PORT: String(opsPort),
      ACS_LOG_LEVEL: "warn",
      ACS_DRAIN_DELAY_MS: "3000",
    });
    await waitForOk(`${url}/readyz`);
    await waitForOk(`${ops}/readyz`);
    if (workers === 2) {
      // Both workers listen and report (the primary counts them).
      await until(
        async () => (await metricTotal(ops, "acs_cluster_workers")) === 2,
        "both workers listen",
        50,
      );
    }
  });

  afterAll(() => {
    for (const pid of workerPidsOf(gateway?.pid ?? 0)) process.kill(pid, "SIGKILL");
    gateway?.kill("SIGKILL");
  });

  it("answers /healthz and /readyz as the main port does, each with its X-Request-Id", async () => {
    const health = await fetch(`${ops}/healthz`, { headers: { "x-request-id": "probe-1" } });
    expect(health.status).toBe(200);
    expect(health.headers.get("x-request-id")).toBe("probe-1");
    expect(await health.json()).toEqual({ status: "ok" });
    const ready = await fetch(`${ops}/readyz`);
    expect(ready.status).toBe(200);
    expect(ready.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
    const body = await ready.json();
    expect(body).toEqual(await (await fetch(`${url}/readyz`)).json());
    expect(body).toEqual({ status: "ready", models: { "acs/tiny": "serving" } });
  });

  it("/metrics there counts the requests the main port served (every worker's)", async () => {
    const before = await metricTotal(ops, "acs_requests_total");
    // New connections each: with two workers they land on either.
    const answers = await Promise.all(
      Array.from({ length: 6 }, () =>
        fetch(`${url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", connection: "close" },
          body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 2, temperature: 0 }),
        }),
      ),
    );
    expect(answers.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
    await until(
      async () => (await metricTotal(ops, "acs_requests_total")) >= before + 6,
      "the requests counted",
    );
    if (workers === 2) expect(await metricTotal(ops, "acs_cluster_workers")).toBe(2);
  });

  it("serves nothing else: another path is 404 and another method 405, each in the error envelope", async () => {
    const missing = await fetch(`${ops}/v1/models`);
    expect(missing.status).toBe(404);
    const id = missing.headers.get("x-request-id");
    expect(await missing.json()).toMatchObject({
      error: { type: "invalid_request_error", code: "unknown_route", param: null },
      request_id: id,
    });
    // A URL fastify cannot route (bad percent-encoding): the envelope and the id, hooks or not.
    const bad = await fetch(`${ops}/v1/models/%zz`);
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({
      error: { code: "invalid_request" },
      request_id: bad.headers.get("x-request-id"),
    });
    const post = await fetch(`${ops}/healthz`, { method: "POST" });
    expect(post.status).toBe(405);
    expect(post.headers.get("allow")).toBe("GET, HEAD");
    expect(await post.json()).toMatchObject({ error: { code: "method_not_allowed" } });
  });

  it.runIf(workers === 2)(
    "workers whose event loops stopped are neither live nor ready there; back once they run",
    async () => {
      const pids = workerPidsOf(gateway.pid ?? 0);
      expect(pids).toHaveLength(2);
      for (const pid of pids) process.kill(pid, "SIGSTOP");
      try {
        // The primary still answers at once, and tells what it knows: no worker heard from.
        await until(async () => (await fetch(`${ops}/healthz`)).status === 503, "not live", 30);
        const ready = await fetch(`${ops}/readyz`);
        expect(ready.status).toBe(503);
        expect(await ready.json()).toEqual({
          status: "not_ready",
          models: {},
          reasons: ["no worker has reported recently (stalled, or not started yet)"],
        });
      } finally {
        for (const pid of pids) process.kill(pid, "SIGCONT");
      }
      await until(async () => (await fetch(`${ops}/healthz`)).status === 200, "live again", 30);
      expect((await fetch(`${ops}/readyz`)).status).toBe(200);
    },
  );

  it("SIGTERM: /readyz there is 503 while the gateway drains, /healthz still 200", async () => {
    gateway.kill("SIGTERM");
    await until(async () => (await fetch(`${ops}/readyz`)).status === 503, "not ready while draining", 10);
    expect(await (await fetch(`${ops}/readyz`)).json()).toEqual({
      status: "not_ready",
      models: { "acs/tiny": "serving" },
      reasons: ["draining: the gateway is shutting down"],
    });
    expect((await fetch(`${ops}/healthz`)).status).toBe(200);
  });
});
