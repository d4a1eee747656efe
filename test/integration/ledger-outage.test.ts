// Issue 33, "a ledger that cannot write gives tokens away": the Budget store stops writing under
// traffic — a SQLite file on a tmpfs that fills up, a PostgreSQL server stopped for 10 s — and
// comes back. Every answer served is charged exactly once (Σ spent = Σ usage), no Hold stays
// open, and /readyz is 503 while the ledger cannot write. src/budget/README.md, "When the store
// fails".
import { execFile } from "node:child_process";
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import Database from "better-sqlite3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as Status } from "../../gen/grpc/health/v1/health_pb.js";
import { LEDGER_NOT_WRITABLE } from "../../src/app/build-app.js";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { until } from "../helpers/hang-guard.js";
import { type PrivatePostgres, startPrivatePostgres } from "../helpers/private-postgres.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What one request got: 200 with its usage, or the error envelope's status and code. */
type Answer = { status: number; usage?: number; code?: string | null; type?: string };

/**
 * Unary requests from `workers` callers, one after another each, until `stop()`; and GET /readyz
 * and gRPC health's Check every 20 ms meanwhile, with the ledger's pending settles.
 */
function traffic(stack: Stack, key: string, workers = 4) {
  const answers: Answer[] = [];
  const readiness: Array<{ status: number; grpc: Status; pending: number; reasons: string[] }> = [];
  const h2 = new Http2SessionManager(stack.url);
  const health = createClient(Health, createGrpcTransport({ baseUrl: stack.url, sessionManager: h2 }));
  let stopping = false;
  let maxPending = 0;
  const one = async (): Promise<void> => {
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 4, temperature: 0, ignore_eos: true }),
    });
    const body = (await res.json()) as {
      usage?: { total_tokens: number };
      error?: { code: string | null; type: string };
    };
    answers.push(
      res.status === 200
        ? { status: 200, usage: body.usage?.total_tokens ?? Number.NaN }
        : { status: res.status, code: body.error?.code ?? null, type: body.error?.type ?? "" },
    );
  };
  const loops = Array.from({ length: workers }, async () => {
    while (!stopping) await one();
  });
  const poller = (async () => {
    while (!stopping) {
      const res = await fetch(`${stack.url}/readyz`);
      const { reasons = [] } = (await res.json()) as { reasons?: string[] };
      const grpc = (await health.check({ service: "" })).status;
      const pending = stack.ledger?.pendingSettles ?? 0;
      maxPending = Math.max(maxPending, pending);
      readiness.push({ status: res.status, grpc, pending, reasons });
      await sleep(20);
    }
  })();
  return {
    answers,
    readiness,
    get maxPending() {
      return maxPending;
    },
    async stop() {
      stopping = true;
      try {
        await Promise.all([...loops, poller]);
      } finally {
        h2.abort();
      }
    },
  };
}

/** Every answer is 200 with a usage or the 503 `upstream_unavailable` envelope: nothing else. */
function expectServedOrUnavailable(answers: readonly Answer[]): Answer[] {
  const served = answers.filter((a) => a.status === 200);
  for (const a of answers) {
    if (a.status === 200) expect(a.usage).toBeGreaterThan(0);
    else expect(a).toEqual({ status: 503, code: "upstream_unavailable", type: "server_error" });
  }
  return served;
}

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);

/** A 503 of /readyz and NOT_SERVING of gRPC health that say the ledger cannot write. */
const ledgerNotReady = (r: { status: number; grpc: Status; reasons: string[] }) =>
  r.status === 503 && r.grpc === Status.NOT_SERVING && r.reasons.includes(LEDGER_NOT_WRITABLE);

/** The value of an unlabelled gauge in the gateway's GET /metrics. */
async function gauge(stack: Stack, name: string): Promise<number> {
  const text = await (await fetch(`${stack.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? Number.NaN : Number(line.slice(name.length + 1));
}

/**
 * An HTTP proxy to the engine that holds each completion `ms` before passing it on: requests stay
 * in flight, their Holds placed, long enough for the store to fail before they settle.
 */
async function delayingProxy(target: string, ms: number): Promise<Server> {
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const headers = { ...req.headers } as Record<string, string>;
    delete headers.host;
    delete headers["content-length"];
    try {
      if (req.url?.startsWith("/v1/completions") === true) await sleep(ms);
      const upstream = await fetch(`${target}${req.url}`, {
        method: req.method ?? "GET",
        headers,
        ...(chunks.length > 0 ? { body: Buffer.concat(chunks) } : {}),
      });
      res.writeHead(upstream.status, Object.fromEntries(upstream.headers));
      for await (const chunk of upstream.body ?? []) res.write(chunk);
      res.end();
    } catch {
      res.destroy();
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return server;
}

/** Fills the file system holding `path` with one file there, up to ENOSPC. */
function fill(path: string): void {
  const fd = openSync(path, "w");
  try {
    const chunk = Buffer.alloc(64 * 1024);
    for (;;) writeSync(fd, chunk);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOSPC") throw err;
  } finally {
    closeSync(fd);
  }
}

/** Whether `cond()` comes to hold within `ms`. */
async function holds(cond: () => boolean, ms: number): Promise<boolean> {
  const giveUp = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > giveUp) return false;
    await sleep(10);
  }
  return true;
}

/** Resolves once `cond()` holds; fails after `ms` (a hang guard far above what it takes, not a speed check). */
async function within(cond: () => boolean, what: string, ms = 30_000): Promise<void> {
  const giveUp = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > giveUp) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(10);
  }
}

describe("SQLite: ACS_DB on a tmpfs that fills up during traffic", () => {
  let dir: string;
  let mounted = false;
  let skipReason: string | undefined;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "acs-ledger-full-"));
    try {
      await run("mount", ["-t", "tmpfs", "-o", "size=4m", "tmpfs", dir]);
      mounted = true;
    } catch (err) {
      skipReason = `mounting a tmpfs needs root (${(err as Error).message.split("\n")[0]}): the full-disk test is skipped`;
    }
  });
  afterAll(async () => {
    if (mounted) await run("umount", ["-l", dir]);
    rmSync(dir, { recursive: true, force: true });
  });

  it("every answer served is charged once its settle is written; /readyz is 503 meanwhile", async (ctx) => {
    if (skipReason !== undefined) ctx.skip(skipReason);
    const dbPath = join(dir, "acs.db");
    // Completions held 150 ms on their way: when the disk fills, requests are in flight with their
    // Holds placed, and their settles fail (the case), not only the next Holds.
    const engine: RunningEngine = await startEngine({ preset: "tiny" });
    const proxy = await delayingProxy(engine.url, 150);
    const stack = await startStack({
      upstreams: [{ url: `http://127.0.0.1:${(proxy.address() as AddressInfo).port}` }],
      model: { id: engine.model.id, servedModelName: engine.model.id },
      dbPath,
    });
    const filler = join(dir, "filler");
    try {
      const ledger = stack.ledger as BudgetLedger;
      const { id, key } = await ledger.createKey({ budgetTokens: 10_000_000 });
      const load = traffic(stack, key, 8);
      let during = { pending: Number.NaN, writable: Number.NaN };
      try {
        await until(() => load.answers.length >= 20, "traffic flowing");
        // Fill the file system: the WAL and the database file cannot grow any more. Whether a settle
        // of a request in flight then fails depends on the room SQLite still has in its WAL, so the
        // disk is filled again (at most 3 times) until one did: the case, answers served
        // while their settles could not be written.
        for (let attempt = 1; ; attempt++) {
          fill(filler);
          await within(
            () => load.readiness.some(ledgerNotReady),
            "/readyz 503 saying the ledger cannot write",
          );
          if (await holds(() => ledger.pendingSettles > 0, 5_000)) break;
          if (attempt === 3) throw new Error("no settle of an answer served failed in 3 fills of the disk");
          rmSync(filler);
          await within(() => ledger.writable && ledger.pendingSettles === 0, "the store writable again");
          load.readiness.length = 0;
        }
        during = {
          pending: await gauge(stack, "acs_budget_settles_pending"),
          writable: await gauge(stack, "acs_budget_ledger_writable"),
        };
        await sleep(1000); // traffic on a full disk
        rmSync(filler);
        await within(() => ledger.writable && ledger.pendingSettles === 0, "the pending settles written");
        const after = load.answers.length;
        await until(() => load.answers.length >= after + 20, "traffic served again");
      } finally {
        await load.stop();
      }
      await within(() => ledger.pendingSettles === 0, "the last settles written");
      const last = await fetch(`${stack.url}/readyz`);
      expect(last.status).toBe(200);
      expect(during.pending).toBeGreaterThan(0);
      expect(during.writable).toBe(0);
      expect(await gauge(stack, "acs_budget_settles_pending")).toBe(0);
      expect(await gauge(stack, "acs_budget_ledger_writable")).toBe(1);

      const served = expectServedOrUnavailable(load.answers);
      const usage = await ledger.usage(id);
      expect(usage.spentTokens).toBe(sum(served.map((a) => a.usage ?? 0)));
      expect(usage).toMatchObject({ heldTokens: 0, openHolds: 0, settledHolds: served.length });
      // Each Hold of an answer served settled once, charged its usage.
      const db = new Database(dbPath, { readonly: true });
      try {
        const holds = db
          .prepare<[string], { state: string; n: number; charged: number }>(
            "SELECT state, count(*) AS n, sum(charged_tokens) AS charged FROM holds WHERE key_id = ? GROUP BY state",
          )
          .all(id);
        expect(holds).toEqual([{ state: "settled", n: served.length, charged: usage.spentTokens }]);
      } finally {
        db.close();
      }
      expect(load.readiness.at(-1)).toMatchObject({ status: 200, grpc: Status.SERVING, reasons: [] });
      // The case happened: answers served while their settles could not be written.
      expect(load.maxPending).toBeGreaterThan(0);
    } finally {
      rmSync(filler, { force: true });
      await stack.close();
      await new Promise<void>((r) => proxy.close(() => r()));
      await engine.close();
    }
  });
});

describe("PostgreSQL stopped, then started again", () => {
  let server: PrivatePostgres | undefined;
  let skipReason: string | undefined;

  beforeAll(async () => {
    const started = await startPrivatePostgres();
    if ("skipReason" in started) skipReason = started.skipReason;
    else server = started;
  }, 120_000);
  afterAll(async () => {
    await server?.remove();
  });

  it("a settle that fails is kept, written once the server is back, and charged once (Holds in the store)", async (ctx) => {
    if (server === undefined) return ctx.skip(skipReason);
    const pgServer = server;
    const changes: boolean[] = [];
    const ledger = await createBudgetLedger({
      postgresUrl: pgServer.url,
      leases: false,
      reclaimIntervalMs: 0,
      onWritableChange: (c) => changes.push(c.writable),
      onReclaimError: () => undefined,
    });
    try {
      const { id, key } = await ledger.createKey({ budgetTokens: 1000 });
      const info = await ledger.authenticate(`Bearer ${key}`);
      const demand = { promptTokens: 2, prompts: 1, n: 1, maxTokens: 10 };
      const holds = [];
      for (let i = 0; i < 3; i++) holds.push(await ledger.placeHold(info, demand));
      await pgServer.stop();
      try {
        const results = [];
        for (const [i, h] of holds.entries()) results.push(await ledger.settle(h.holdId, 5 + i));
        expect(results.map((r) => r.outcome)).toEqual(["pending", "pending", "pending"]);
        expect(ledger.writable).toBe(false);
        expect(ledger.pendingSettles).toBe(3);
        const refused = await ledger.placeHold(info, demand).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(refused).toBeInstanceOf(ApiError);
        expect(refused).toMatchObject({ code: "upstream_unavailable", status: 503 });
      } finally {
        await pgServer.start();
      }
      await within(() => ledger.writable, "the pending settles written");
      const usage = await ledger.usage(id);
      // 11 + 11 + 11 held, 5 + 6 + 7 charged: the Holds stayed reserved until their settles were written.
      expect(usage).toMatchObject({ spentTokens: 18, heldTokens: 0, openHolds: 0, settledHolds: 3 });
      expect(await ledger.settle(holds[0]?.holdId ?? "", 5)).toMatchObject({ outcome: "already_settled" });
      expect((await ledger.usage(id)).spentTokens).toBe(18);
      expect(changes).toEqual([false, true]);
    } finally {
      await ledger.close();
    }
  });

  it("through the gateway (leases), stopped for 10 s during traffic: Σ spent = Σ usage, /readyz 503 meanwhile", async (ctx) => {
    if (server === undefined) return ctx.skip(skipReason);
    const pgServer = server;
    const stack = await startStack({ db: { kind: "postgres", url: pgServer.url } });
    try {
      const ledger = stack.ledger as BudgetLedger;
      const { id, key } = await ledger.createKey({ budgetTokens: 10_000_000 });
      const load = traffic(stack, key);
      let outage: typeof load.readiness = [];
      try {
        await until(() => load.answers.length >= 20, "traffic flowing");
        const from = load.readiness.length;
        await pgServer.stop();
        try {
          await sleep(10_000);
        } finally {
          await pgServer.start();
        }
        outage = load.readiness.slice(from);
        await within(() => ledger.writable, "the ledger writes again");
        const after = load.answers.length;
        await until(() => load.answers.length >= after + 20, "traffic served again");
      } finally {
        await load.stop();
      }
      await ledger.syncLeases(); // the charges of the last lease sync interval
      expect(outage.some(ledgerNotReady)).toBe(true);
      expect((await fetch(`${stack.url}/readyz`)).status).toBe(200);

      const served = expectServedOrUnavailable(load.answers);
      const usage = await ledger.usage(id);
      expect(usage.spentTokens).toBe(sum(served.map((a) => a.usage ?? 0)));
      expect(usage).toMatchObject({ heldTokens: 0, openHolds: 0, settledHolds: served.length });
    } finally {
      await stack.close();
    }
  });
});
