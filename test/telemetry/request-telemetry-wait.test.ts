// The access line of a caller who went away while the service still runs its call waits for the
// call's tokens (CallRecord.running / onEnd, src/service/types.ts), is written at the server's
// close at the latest, and a stream whose caller left during its checks is not counted in flight.
// A real fastify app with the gateway's request telemetry; each route plays the service's part of
// the CallRecord contract.
import { once } from "node:events";
import { request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import { pino } from "pino";
import { Registry } from "prom-client";
import { afterEach, describe, expect, it } from "vitest";
import type { CallRecord } from "../../src/core/index.js";
import {
  type CallMetrics,
  callRecordOf,
  createCallMetrics,
  createTracing,
  observeRequests,
  type RequestObserver,
} from "../../src/telemetry/index.js";
import { until } from "../helpers/hang-guard.js";

type Line = Record<string, unknown>;

interface Rig {
  app: FastifyInstance;
  url: string;
  lines: Line[];
  metrics: CallMetrics;
  /** The record of the call the route is running, once it runs. */
  running: Promise<CallRecord>;
  /** What observeRequests gave back. */
  observer: RequestObserver;
}

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.app.close();
  rig = undefined;
});

/**
 * An app whose POST /call marks its record running (as the service does past its checks) and
 * never answers; `beforeRunning` runs first (a check the caller may leave during). `onClose` is an
 * onClose hook registered after the telemetry's, which fastify runs first (last registered, first
 * run), as the gateway's pools, ledger, engine and tracing close (src/surfaces/http/build-server.ts).
 */
async function start(
  beforeRunning?: (closed: Promise<unknown>) => Promise<void>,
  onClose?: () => Promise<void>,
): Promise<Rig> {
  const lines: Line[] = [];
  const logger = pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s) as Line) });
  const app = Fastify({ loggerInstance: logger as FastifyBaseLogger });
  const metrics = createCallMetrics(new Registry());
  const observer = observeRequests(app, { metrics, tracing: createTracing() });
  if (onClose !== undefined) app.addHook("onClose", onClose);
  let resolveRunning: (r: CallRecord) => void = () => undefined;
  const running = new Promise<CallRecord>((r) => {
    resolveRunning = r;
  });
  app.post("/v1/completions", async (request, reply) => {
    const record = callRecordOf(request);
    if (record === undefined) throw new Error("no call record");
    await beforeRunning?.(once(reply.raw, "close"));
    record.streamStarted?.();
    record.running = true;
    resolveRunning(record);
    await new Promise(() => undefined); // the service's call, still running
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const { port } = app.server.address() as AddressInfo;
  rig = { app, url: `http://127.0.0.1:${port}`, lines, metrics, running, observer };
  return rig;
}

/** Sends a request and destroys it once `when` has resolved: a caller who goes away. */
function callAndLeave(url: string, when: Promise<unknown>): void {
  const req = httpRequest(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
  });
  req.on("error", () => undefined);
  req.end("{}");
  void when.then(() => req.destroy());
}

/** The service's end of a call: its tokens recorded, `running` off, whoever waits told. */
function endCall(record: CallRecord, promptTokens: number, completionTokens: number): void {
  record.promptTokens = promptTokens;
  record.completionTokens = completionTokens;
  record.running = false;
  const onEnd = record.onEnd;
  delete record.onEnd;
  onEnd?.();
}

const accessLines = (r: Rig) => r.lines.filter((l) => l.msg === "request");
const gauge = async (g: CallMetrics["inFlight"]) => (await g.get()).values.reduce((a, v) => a + v.value, 0);

describe("a caller gone while the service runs the call", () => {
  it("the access line and the gauges wait for the call's tokens", async () => {
    const r = await start();
    callAndLeave(r.url, r.running);
    const record = await r.running;
    await until(() => record.onEnd !== undefined, "the close handler waits for the call");
    expect(accessLines(r)).toEqual([]);
    expect(await gauge(r.metrics.inFlight)).toBe(1);
    endCall(record, 7, 2);
    expect(accessLines(r)).toMatchObject([
      { status: 499, canceled: true, promptTokens: 7, completionTokens: 2 },
    ]);
    expect(await gauge(r.metrics.inFlight)).toBe(0);
    endCall(record, 7, 2); // a second end changes nothing
    expect(accessLines(r)).toHaveLength(1);
  });

  it("is written when the server closes at the latest", async () => {
    const r = await start();
    callAndLeave(r.url, r.running);
    const record = await r.running;
    await until(() => record.onEnd !== undefined, "the close handler waits for the call");
    await r.app.close();
    expect(accessLines(r)).toMatchObject([{ status: 499, canceled: true }]);
    expect(accessLines(r)[0]).not.toHaveProperty("promptTokens");
    expect(await gauge(r.metrics.inFlight)).toBe(0);
  });

  it("a stream whose caller left during its checks is not counted in flight", async () => {
    let left: () => void = () => undefined;
    const leave = new Promise<void>((resolve) => {
      left = resolve;
    });
    // The check ends only once the caller has gone and the response has closed.
    const r = await start(async (closed) => {
      left();
      await closed;
    });
    callAndLeave(r.url, leave);
    const record = await r.running; // streamStarted() was called after the close
    expect(accessLines(r)).toMatchObject([{ status: 499, canceled: true }]);
    expect(await gauge(r.metrics.streamsInFlight)).toBe(0);
    expect(await gauge(r.metrics.inFlight)).toBe(0);
    endCall(record, 1, 0);
    expect(accessLines(r)).toHaveLength(1);
  });
});

describe("a server whose close does not finish (src/main.ts then exits by force)", () => {
  it("flushWaiting() writes the lines still waiting, once, while the close is stuck", async () => {
    let stuck = false;
    let release: () => void = () => undefined;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const r = await start(undefined, async () => {
      stuck = true;
      await released;
    });
    callAndLeave(r.url, r.running);
    const record = await r.running;
    await until(() => record.onEnd !== undefined, "the close handler waits for the call");
    const closing = r.app.close();
    try {
      await until(() => stuck, "the close is stuck in an onClose hook before the telemetry's");
      expect(accessLines(r)).toEqual([]); // the app's close would write it, but does not get there
      expect(r.observer.flushWaiting()).toBe(1);
      expect(accessLines(r)).toMatchObject([{ status: 499, canceled: true }]);
      expect(accessLines(r)[0]).not.toHaveProperty("promptTokens");
      expect(await gauge(r.metrics.inFlight)).toBe(0);
      expect(r.observer.flushWaiting()).toBe(0);
    } finally {
      release();
      await closing;
    }
    endCall(record, 7, 2); // the service's end, too late for the line
    expect(accessLines(r)).toHaveLength(1);
  });
});
