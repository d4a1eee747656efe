// Two gateway replicas on one PostgreSQL database; one stalls (SIGSTOP) past its lease's expiry
// while it serves requests placed on that lease, and the other reclaims the lease (its tokens are
// free for others again). Resumed, the stalled replica delivers only what the Budget still holds:
// with the Budget spent meanwhile its requests are refused (429), never served past the Budget;
// with room left they are served and charged exactly (src/budget/README.md, "What a crash costs").
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { until } from "../helpers/hang-guard.js";
import { testDatabase } from "../helpers/postgres.js";
import { completeTiny, type ReplicaSetup, startReplica } from "../helpers/replicas.js";

const database = testDatabase("stall");
const dir = mkdtempSync(join(tmpdir(), "acs-stall-"));
const children: ChildProcess[] = [];
const replicas: ReplicaSetup = { dir, database, children };
let engine: RunningEngine | undefined;
let slow: Server | undefined;
/** Completions the slow proxy received (a streamed capture's replay is the second of its request). */
let completionsSeen = 0;
let admin: BudgetLedger | undefined;

beforeAll(async () => {
  await database.create();
  if (database.skipReason !== undefined) return;
  engine = await startEngine({ preset: "tiny" });
  // Holds every completion 3 s before passing it on: the requests are in flight on their Holds
  // when their replica is stopped.
  slow = createServer(async (req, res) => {
    try {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const headers = { ...req.headers } as Record<string, string>;
      delete headers.host;
      delete headers["content-length"];
      if (req.url === "/v1/completions") {
        completionsSeen++;
        await sleep(3000);
      }
      const upstream = await fetch(`${engine!.url}${req.url}`, {
        method: req.method ?? "GET",
        headers,
        ...(chunks.length > 0 ? { body: Buffer.concat(chunks) } : {}),
      });
      res.writeHead(upstream.status, Object.fromEntries(upstream.headers));
      res.end(Buffer.from(await upstream.arrayBuffer()));
    } catch {
      res.destroy();
    }
  });
  await new Promise<void>((r) => slow!.listen(0, "127.0.0.1", r));
  admin = await createBudgetLedger({ postgresUrl: database.url, leases: false, reclaimIntervalMs: 0 });
});

afterAll(async () => {
  for (const c of children) c.kill("SIGKILL");
  await admin?.close();
  await new Promise<void>((r) => (slow ? slow.close(() => r()) : r()));
  await engine?.close();
  await sleep(500);
  await database.drop();
  rmSync(dir, { recursive: true, force: true });
});

/** A stream's events, parsed (the `[DONE]` marker as the string). */
async function streamEvents(url: string, key: string, body: Record<string, unknown>) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      model: "tiny",
      prompt: "Hi",
      temperature: 0,
      ignore_eos: true,
      stream: true,
      ...body,
    }),
  });
  const text = await res.text();
  return {
    status: res.status,
    events: text
      .split("\n\n")
      .filter((e) => e.startsWith("data: "))
      .map((e) => (e === "data: [DONE]" ? "[DONE]" : (JSON.parse(e.slice(6)) as Record<string, unknown>))),
  };
}

/** Waits until another replica reclaimed every lease `instanceId` held on the key. */
async function reclaimedFrom(instanceId: string, keyId: string): Promise<void> {
  const client = new pg.Client({ connectionString: database.url });
  await client.connect();
  try {
    await until(
      async () => {
        const { rows } = await client.query<{ open: string; reclaimed: string }>(
          `SELECT count(*) FILTER (WHERE state = 'open') AS open,
                  count(*) FILTER (WHERE state = 'reclaimed') AS reclaimed
           FROM leases WHERE instance_id = $1 AND key_id = $2`,
          [instanceId, keyId],
        );
        return Number(rows[0]?.open) === 0 && Number(rows[0]?.reclaimed) > 0;
      },
      `${instanceId}'s leases were reclaimed`,
      100,
    );
  } finally {
    await client.end();
  }
}

describe("a replica stalled past its lease's expiry, then resumed", () => {
  it("the Budget spent meanwhile by the other replica: its requests are refused, never served past the Budget", async (ctx) => {
    if (database.skipReason !== undefined) ctx.skip(database.skipReason);
    const slowUrl = `http://127.0.0.1:${(slow!.address() as AddressInfo).port}`;
    const a = await startReplica(replicas, slowUrl, "gw-spent-a");
    const b = await startReplica(replicas, engine!.url, "gw-spent-b");
    // "Hi" is 3 prompt tokens with the tiny preset: each request holds and uses 3 + 7.
    const { id, key } = await admin!.createKey({ budgetTokens: 100 * 10 });
    // 9 requests and a stream on A, held 3 s by Inference: their Holds sit on A's lease.
    const onA = Array.from({ length: 9 }, () => completeTiny(a.url, key, { max_tokens: 7 }));
    const stream = streamEvents(a.url, key, { max_tokens: 7 });
    await until(async () => (await admin!.usage(id)).leasedTokens > 0, "A leased", 20);
    await sleep(300); // the requests reached A's Holds
    a.child.kill("SIGSTOP");
    await reclaimedFrom("gw-spent-a", id);
    const onB = await Promise.all(
      Array.from({ length: 100 }, () => completeTiny(b.url, key, { max_tokens: 7 })),
    );
    a.child.kill("SIGCONT");
    const fromA = await Promise.all(onA);
    const streamed = await stream;

    expect(onB.filter((r) => r.status === 200)).toHaveLength(100);
    expect(fromA.map((r) => [r.status, r.error?.code, r.error?.type])).toEqual(
      Array.from({ length: 9 }, () => [429, "insufficient_quota", "insufficient_quota"]),
    );
    expect(fromA[0]?.error?.message).toMatch(/Budget no longer holds the tokens of this request/);
    // The stream delivers no token: refused before its head (429), or its one event is the error
    // (its head went out with a keepalive while it waited for its first chunk).
    const errors = streamed.events.filter((e) => typeof e === "object" && "error" in e);
    const chunks = streamed.events.filter((e) => typeof e === "object" && "choices" in e);
    expect(chunks).toEqual([]);
    if (streamed.status === 200) {
      expect(errors).toHaveLength(1);
      expect(errors[0]).toMatchObject({ error: { code: "insufficient_quota" } });
      expect(streamed.events.at(-1)).toBe("[DONE]");
    } else {
      expect(streamed.status).toBe(429);
    }
    await until(
      async () => (await admin!.usage(id)).leases === 0,
      "A's new lease steps and B's idle lease ended",
      250,
    );
    expect(await admin!.usage(id)).toMatchObject({
      spentTokens: 1000,
      heldTokens: 0,
      leasedTokens: 0,
      openHolds: 0,
    });
    a.child.kill("SIGTERM");
    b.child.kill("SIGTERM");
  });

  it("the Budget has room: its requests and its stream are served in full and charged exactly what they used", async (ctx) => {
    if (database.skipReason !== undefined) ctx.skip(database.skipReason);
    const slowUrl = `http://127.0.0.1:${(slow!.address() as AddressInfo).port}`;
    const a = await startReplica(replicas, slowUrl, "gw-room-a");
    const b = await startReplica(replicas, engine!.url, "gw-room-b");
    const { id, key } = await admin!.createKey({ budgetTokens: 1_000_000 });
    const onA = Array.from({ length: 5 }, (_, i) => completeTiny(a.url, key, { max_tokens: 3 + i }));
    const stream = streamEvents(a.url, key, { max_tokens: 12, stream_options: { include_usage: true } });
    await until(async () => (await admin!.usage(id)).leasedTokens > 0, "A leased", 20);
    await sleep(300);
    a.child.kill("SIGSTOP");
    await reclaimedFrom("gw-room-a", id);
    a.child.kill("SIGCONT");
    const fromA = await Promise.all(onA);
    const streamed = await stream;

    expect(fromA.map((r) => [r.status, r.usage?.total_tokens])).toEqual([
      [200, 6],
      [200, 7],
      [200, 8],
      [200, 9],
      [200, 10],
    ]);
    expect(streamed.status).toBe(200);
    expect(streamed.events.at(-1)).toBe("[DONE]");
    const usage = streamed.events.at(-2) as { usage?: { total_tokens: number } };
    expect(usage.usage?.total_tokens).toBe(15);
    expect(streamed.events.some((e) => typeof e === "object" && "error" in e)).toBe(false);
    // Nothing was charged twice and nothing forgotten: the reclaim charged no renewal, the Holds
    // moved into the store charged the rest.
    await until(async () => (await admin!.usage(id)).leases === 0, "A's leases ended", 250);
    expect(await admin!.usage(id)).toMatchObject({
      spentTokens: 6 + 7 + 8 + 9 + 10 + 15,
      heldTokens: 0,
      leasedTokens: 0,
      openHolds: 0,
    });
    a.child.kill("SIGTERM");
    b.child.kill("SIGTERM");
  });
  it("a streamed capture whose replay ran while its replica stalled: its activations are not delivered past the Budget", async (ctx) => {
    if (database.skipReason !== undefined) ctx.skip(database.skipReason);
    const slowUrl = `http://127.0.0.1:${(slow!.address() as AddressInfo).port}`;
    const a = await startReplica(replicas, slowUrl, "gw-replay-a");
    const b = await startReplica(replicas, engine!.url, "gw-replay-b");
    const { id, key } = await admin!.createKey({ budgetTokens: 100 * 10 });
    const seenBefore = completionsSeen;
    const stream = streamEvents(a.url, key, { max_tokens: 5, output_residual_stream: [0] });
    // The text went out; the replay (a second completion, held 3 s by the proxy) is on its way.
    await until(async () => completionsSeen >= seenBefore + 2, "the capture's replay was sent", 10);
    a.child.kill("SIGSTOP");
    await reclaimedFrom("gw-replay-a", id);
    // Other requests spend what the reclaim gave back: one Hold in the store for all of it, used
    // whole (the Inference work of B's requests is not what this case is about, and on a loaded
    // machine 100 completions on the in-process engine outlasted the test's hang guard).
    const free = (await admin!.usage(id)).availableTokens;
    expect(free).toBeGreaterThan(900); // the stream held 3 + 5 + its replay's 7; the reclaim charged its renewals
    const spend = await admin!.placeHold(await admin!.authenticate(`Bearer ${key}`), {
      promptTokens: 0,
      prompts: 1,
      n: 1,
      maxTokens: free,
    });
    expect(spend).toMatchObject({ heldTokens: free, clamped: false });
    await admin!.settle(spend.holdId, free);
    a.child.kill("SIGCONT");
    const streamed = await stream;

    expect(streamed.status).toBe(200);
    const chunks = streamed.events.filter((e): e is Record<string, unknown> => typeof e === "object");
    const text = chunks.filter((e) => "choices" in e && !("activations" in e));
    expect(text.length).toBeGreaterThan(0); // delivered before the stall, while the lease stood
    expect(chunks.some((e) => "activations" in e)).toBe(false);
    expect(chunks.at(-1)).toMatchObject({ error: { code: "insufficient_quota" } });
    expect(streamed.events.at(-1)).toBe("[DONE]");
    // Nothing past the Budget: the stream's settle could charge only what the key had free (none).
    await until(async () => (await admin!.usage(id)).leases === 0, "the leases ended", 250);
    expect(await admin!.usage(id)).toMatchObject({
      spentTokens: 1000,
      heldTokens: 0,
      leasedTokens: 0,
      openHolds: 0,
    });
    a.child.kill("SIGTERM");
    b.child.kill("SIGTERM");
  });
});
