// ACS_WORKERS=2 with keys on: the per-key caps of proto/API.md §9 hold for the gateway, not for
// each worker process. The primary counts every worker's requests: a key at its stream cap is
// refused on whichever worker its next connection reaches, a place comes back when its stream
// ends, and a worker killed with places held gives them back.
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Agent, fetch as undiciFetch } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ADMIT_ANSWER_MS } from "../../src/app/cluster/index.js";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { until } from "../helpers/hang-guard.js";
import { workerPidsOf } from "../helpers/proc.js";
import { freePort, startTs, waitForOk } from "../helpers/processes.js";
import { holdsByWorker } from "../helpers/sqlite-holds.js";
import { chunk, type FakeUpstream, sse, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

const MODEL = "fake-model";

/** Whether `pid` has exited and waits for its parent to reap it. */
function isZombie(pid: number): boolean {
  try {
    return /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, "utf8"));
  } catch {
    return true;
  }
}
const STREAM_CAP = 2;
const dir = mkdtempSync(join(tmpdir(), "acs-cluster-admission-"));
const dbPath = join(dir, "acs.db");
/** Inference's completion streams, held open after their first chunk until {@link finishHeld}. */
const held: ServerResponse[] = [];
let fake: FakeUpstream;
let primary: ChildProcess;
let url: string;
let admin: BudgetLedger;

/** Ends every held stream of Inference (a last chunk, then `[DONE]`). */
function finishHeld(): void {
  for (const res of held.splice(0)) res.end(sse([chunk(0, " b", "length")]));
}

/** The gateway's workers listening now, as the primary counts them (-1 when /metrics fails). */
async function workersListening(): Promise<number> {
  try {
    const text = await (await fetch(`${url}/metrics`)).text();
    return Number(/^acs_cluster_workers (\S+)$/m.exec(text)?.[1] ?? -1);
  } catch {
    return -1;
  }
}

/**
 * `count` streamed requests of `key` at once, each on a connection of its own (a kept-alive
 * connection stays with the worker that accepted it): their statuses and bodies, a 200's body
 * once its stream ends.
 */
function streams(key: string, count: number): Array<Promise<{ status: number; body: Promise<string> }>> {
  const fresh = new Agent({ pipelining: 0 });
  const all = Array.from({ length: count }, async () => {
    const res = await undiciFetch(`${url}/v1/completions`, {
      method: "POST",
      dispatcher: fresh,
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: MODEL, prompt: "The sky is", max_tokens: 2, stream: true }),
    });
    const body = res.text();
    // A stream its worker's death cuts rejects its body: handled when a case reads it, and not an
    // unhandled rejection meanwhile (vitest fails the run on one).
    body.catch(() => undefined);
    return { status: res.status, body };
  });
  // A request its worker's death cuts before its headers rejects the request itself: the same,
  // while a case awaits something else before reading them (a case that awaits one still sees it).
  for (const r of all) r.catch(() => undefined);
  return all;
}

beforeAll(async () => {
  fake = await startFakeUpstream(
    withVllmOps(
      (req, res, body) => {
        if (req.url === "/tokenize") {
          // A token per character (the gateway asks once how many tokens "" becomes: none here).
          const { prompt } = JSON.parse(body) as { prompt: string };
          res.setHeader("content-type", "application/json");
          res.end(
            JSON.stringify({ count: prompt.length, max_model_len: 4096, tokens: [...prompt].map(() => 1) }),
          );
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(sse([chunk(0, " a")], false));
        held.push(res);
      },
      MODEL,
      4096,
    ),
  );
  const modelsPath = join(dir, "models.json");
  writeFileSync(
    modelsPath,
    JSON.stringify({
      models: [
        {
          id: MODEL,
          upstream_url: fake.url,
          hidden_size: 64,
          num_hidden_layers: 4,
          byte_level_tokenizer: true,
        },
      ],
    }),
  );
  admin = await createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 });
  const port = await freePort();
  url = `http://127.0.0.1:${port}`;
  primary = startTs(["src/main.ts"], {
    ACS_WORKERS: "2",
    // These cases stop workers on purpose; the primary's watchdog has its own (worker-timeout).
    ACS_WORKER_TIMEOUT_MS: "0",
    ACS_MODELS: modelsPath,
    ACS_DB: dbPath,
    ACS_MAX_STREAMS_PER_KEY: String(STREAM_CAP),
    PORT: String(port),
    ACS_LOG_LEVEL: "warn",
  });
  await waitForOk(`${url}/healthz`);
  await until(async () => (await workersListening()) === 2, "two workers listen");
});

afterAll(async () => {
  finishHeld();
  if (primary?.pid !== undefined) {
    for (const pid of workerPidsOf(primary.pid)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {}
    }
  }
  primary?.kill("SIGKILL");
  await admin?.close();
  await fake?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("ACS_WORKERS=2: the per-key caps count every worker's requests", () => {
  it("a key at its stream cap is refused whichever worker its connection reaches, and admitted again once a stream ends", async () => {
    const { id, key } = await admin.createKey({ budgetTokens: 1_000_000 });
    // Eight streams at once, on eight connections spread over both workers by the kernel.
    const first = await Promise.all(streams(key, 8));
    const admitted = first.filter((r) => r.status === 200);
    const refused = first.filter((r) => r.status === 429);
    expect(admitted).toHaveLength(STREAM_CAP);
    expect(refused).toHaveLength(8 - STREAM_CAP);
    const envelope = JSON.parse(await (refused[0] as { body: Promise<string> }).body) as {
      error: { code: string; message: string };
    };
    expect(envelope.error.code).toBe("rate_limited");
    expect(envelope.error.message).toBe(
      `This key already has ${STREAM_CAP} streams open: the per-key stream cap is ${STREAM_CAP} concurrent streams. Retry when one of them has finished.`,
    );
    // Eight more while both streams are open: refused on both workers alike.
    const more = await Promise.all(streams(key, 8));
    expect(more.map((r) => r.status)).toEqual(Array(8).fill(429));
    expect(Object.values(holdsByWorker(dbPath, id)).reduce((a, n) => a + n, 0)).toBe(STREAM_CAP);

    // The streams end: their places come back, and the key streams again.
    await until(() => held.length === STREAM_CAP, "Inference holds both streams");
    finishHeld();
    for (const r of admitted) expect(await r.body).toContain("data: [DONE]");
    await until(async () => {
      const again = await Promise.all(streams(key, 1));
      const ok = again[0]?.status === 200;
      if (ok) {
        await until(() => held.length === 1, "Inference holds the stream");
        finishHeld();
        await again[0]?.body;
      }
      return ok;
    }, "a place came back");
  });

  it("a stopped primary does not hold a keyed request up: its worker counts alone until the primary answers again", async () => {
    const { key } = await admin.createKey({ budgetTokens: 1_000_000 });
    const pid = primary.pid ?? 0;
    process.kill(pid, "SIGSTOP");
    let stopped: Array<{ status: number; body: Promise<string> }>;
    try {
      stopped = await Promise.all(streams(key, 1));
    } finally {
      process.kill(pid, "SIGCONT");
    }
    expect(stopped.map((r) => r.status)).toEqual([200]);
    await until(() => held.length === 1, "Inference holds the stream");
    finishHeld();
    await Promise.all(stopped.map((r) => r.body));
    // Running again, the primary answers the workers' next admits: the caps are the gateway's again.
    await until(async () => {
      const burst = await Promise.all(streams(key, 8));
      const admitted = burst.filter((r) => r.status === 200).length;
      await until(() => held.length === admitted, "Inference holds the admitted streams");
      finishHeld();
      await Promise.all(burst.map((r) => r.body));
      return admitted === STREAM_CAP;
    }, "both workers count through the primary again");
  });

  it("the places of a worker killed with streams open come back when it dies", async () => {
    const { key } = await admin.createKey({ budgetTokens: 1_000_000 });
    const open = await Promise.all(streams(key, STREAM_CAP));
    expect(open.map((r) => r.status)).toEqual(Array(STREAM_CAP).fill(200));
    expect((await Promise.all(streams(key, 1)))[0]?.status).toBe(429);
    // Both workers die (the streams with them); the primary starts two others.
    for (const pid of workerPidsOf(primary.pid ?? 0)) process.kill(pid, "SIGKILL");
    await Promise.all(open.map((r) => r.body.catch(() => "")));
    finishHeld();
    await until(async () => (await workersListening()) === 2, "two workers listen again");
    const after = await Promise.all(streams(key, STREAM_CAP));
    expect(after.map((r) => r.status)).toEqual(Array(STREAM_CAP).fill(200));
    await until(() => held.length === STREAM_CAP, "Inference holds both streams");
    finishHeld();
    await Promise.all(after.map((r) => r.body));
  });

  it("a worker held up past the wait reads the primary's answer already in its channel: it does not count alone", async () => {
    const { key } = await admin.createKey({ budgetTokens: 1_000_000 });
    const pid = primary.pid ?? 0;
    const workers = workerPidsOf(pid);
    process.kill(pid, "SIGSTOP");
    let first: Promise<{ status: number; body: Promise<string> }> | undefined;
    try {
      [first] = streams(key, 1);
      await sleep(300); // its worker has asked the primary for the place, and waits
      for (const w of workers) process.kill(w, "SIGSTOP");
    } finally {
      process.kill(pid, "SIGCONT"); // the primary answers into the stopped worker's channel
    }
    // The worker's wait for the answer passes while it cannot run; then it runs again.
    await sleep(ADMIT_ANSWER_MS + 500);
    for (const w of workers) process.kill(w, "SIGCONT");
    expect((await first)?.status).toBe(200);
    // Had the worker counted that stream alone (its timer run before its channel was read), both
    // workers would admit more: the primary's count says one stream of two is open.
    const more = await Promise.all(streams(key, 8));
    expect(more.filter((r) => r.status === 200)).toHaveLength(STREAM_CAP - 1);
    await until(() => held.length === STREAM_CAP, "Inference holds the admitted streams");
    finishHeld();
    await Promise.all([first, ...more.map(async (r) => r)].map(async (r) => (await r)?.body));
  });

  it("a worker killed while its admits wait for a stopped primary: the primary answers nobody, lives on, and counts no place for it", async () => {
    const { key } = await admin.createKey({ budgetTokens: 1_000_000 });
    const pid = primary.pid ?? 0;
    const exited = new Promise<string>((resolve) =>
      primary.once("exit", (code, signal) => resolve(`exited ${code ?? signal}`)),
    );
    process.kill(pid, "SIGSTOP");
    let open: Array<Promise<{ status: number; body: Promise<string> }>>;
    try {
      // Their admits wait in the primary's channels; the workers then count alone and Inference
      // gets the streams.
      open = streams(key, STREAM_CAP);
      await until(() => held.length === STREAM_CAP, "Inference holds the streams counted alone");
      // The workers die with their admits still unread by the primary.
      const workers = workerPidsOf(pid);
      for (const w of workers) process.kill(w, "SIGKILL");
      // Dead (zombies, their sockets closed) before the primary runs again.
      await until(() => workers.every(isZombie), "the workers are dead");
    } finally {
      process.kill(pid, "SIGCONT");
    }
    await Promise.all(open.map((r) => r.then((x) => x.body).catch(() => "")));
    finishHeld();
    // The primary reads the dead workers' admits: it must neither throw answering them (EPIPE)
    // nor keep their places. It starts two workers again.
    const outcome = await Promise.race([
      exited,
      until(async () => (await workersListening()) === 2, "two workers listen again").then(() => "listening"),
    ]);
    expect(outcome).toBe("listening");
    const after = await Promise.all(streams(key, STREAM_CAP + 1));
    expect(after.map((r) => r.status).sort()).toEqual([...Array(STREAM_CAP).fill(200), 429]);
    await until(() => held.length === STREAM_CAP, "Inference holds the admitted streams");
    finishHeld();
    await Promise.all(after.map((r) => r.body));
  });
});
