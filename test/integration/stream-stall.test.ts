// Callers that stop reading cannot pin the gateway: 140 streams whose callers never read (REST,
// Connect, gRPC-Web over HTTP/1.1, gRPC over HTTP/2) beside a probe caller whose requests are all
// served; once Inference has more for them than their connections take, each is ended after
// ACS_STREAM_STALL_MS — Inference's request aborted, the caller's connection ended, its Hold
// settled to what was generated and its admission given back.
import { mkdtempSync, rmSync } from "node:fs";
import http2 from "node:http2";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { Agent, fetch as undiciFetch } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { frame } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import {
  drainedOrClosed,
  type FakeUpstream,
  startFakeUpstream,
  withVllmOps,
} from "../upstream/fake-upstream.js";

const MAX_MODEL_LEN = 100_000;
const PINNED_REST = 128;
const FLOOD_REST = 3;
const FLOOD_TEXT = "x".repeat(16 * 1024);

/**
 * Inference: a token per character. A "pin" stream sends one small chunk, then nothing. A "flood"
 * stream sends one small chunk at once, then waits for
 * the gate; once it opens, 16 KiB chunks as fast as the gateway takes them, until the gateway
 * closes the request. Any other prompt: one token "ok".
 */
interface FloodInference extends FakeUpstream {
  readonly floods: { started: number; open: number; aborted: number; chunks: number };
  /** "pin" streams: one chunk, then nothing until the gateway closes them. */
  readonly pinned: { open: number };
  openGate(): void;
}

async function floodInference(): Promise<FloodInference> {
  const floods = { started: 0, open: 0, aborted: 0, chunks: 0 };
  const pinned = { open: 0 };
  let openGate = () => {};
  const gate = new Promise<void>((resolve) => {
    openGate = resolve;
  });
  const event = (text: string, usage: unknown = null) =>
    `data: ${JSON.stringify({
      id: "cmpl-x",
      object: "text_completion",
      created: 1,
      model: "acs/fake",
      choices:
        text === ""
          ? []
          : [{ index: 0, text, logprobs: null, finish_reason: null, stop_reason: null, token_ids: [1] }],
      usage,
    })}\n\n`;
  const upstream = await startFakeUpstream(
    withVllmOps(
      async (req, res, body) => {
        const json = JSON.parse(body) as { prompt: string };
        if (req.url === "/tokenize") {
          res.setHeader("content-type", "application/json");
          const tokens = [...json.prompt].map(() => 1);
          res.end(JSON.stringify({ count: tokens.length, max_model_len: MAX_MODEL_LEN, tokens }));
          return;
        }
        res.writeHead(200, { "content-type": "text/event-stream" });
        if (json.prompt !== "flood" && json.prompt !== "pin") {
          const n = json.prompt.length;
          res.end(
            `${event("ok")}${event("", { prompt_tokens: n, completion_tokens: 1, total_tokens: n + 1 })}data: [DONE]\n\n`,
          );
          return;
        }
        if (json.prompt === "pin") {
          pinned.open++;
          res.on("close", () => pinned.open--);
          res.write(event("start"));
          return;
        }
        floods.started++;
        floods.open++;
        res.on("close", () => {
          floods.open--;
          if (!res.writableFinished) floods.aborted++;
        });
        res.write(event("start"));
        await gate;
        while (!res.destroyed) {
          floods.chunks++;
          if (!res.write(event(FLOOD_TEXT))) await drainedOrClosed(res);
        }
      },
      "acs/fake",
      MAX_MODEL_LEN,
    ),
  );
  return Object.assign(upstream, { floods, pinned, openGate: () => openGate() });
}

/** A caller on its own HTTP/1.1 connection that sends its request and never reads the answer. */
interface StalledCaller {
  /** Reads what the gateway sent and resolves once the gateway closed the connection. */
  drainToClose(): Promise<string>;
  /** Closes the caller's side (cleanup). */
  destroy(): void;
}

/** Every caller the test opened, closed after it whatever its outcome. */
const callers: StalledCaller[] = [];

function stalledH1(
  port: number,
  path: string,
  headers: Record<string, string>,
  body: Uint8Array,
): StalledCaller {
  const socket = net.connect(port, "127.0.0.1");
  socket.on("error", () => {});
  socket.pause();
  const head = Object.entries({ host: "127.0.0.1", ...headers, "content-length": String(body.length) })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("");
  socket.write(`POST ${path} HTTP/1.1\r\n${head}\r\n`);
  socket.write(body);
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
  const caller: StalledCaller = {
    destroy: () => socket.destroy(),
    async drainToClose() {
      let text = "";
      socket.on("data", (b: Buffer) => {
        text += b.toString("latin1");
      });
      socket.resume();
      await closed;
      return text;
    },
  };
  callers.push(caller);
  return caller;
}

function stalledH2(url: string, headers: Record<string, string>, body: Uint8Array): StalledCaller {
  const session = http2.connect(url);
  session.on("error", () => {});
  const stream = session.request({
    ":method": "POST",
    ":path": "/acs.v1.CompletionsService/StreamCompletion",
    ...headers,
  });
  stream.on("error", () => {});
  stream.pause();
  stream.end(body);
  const closed = new Promise<void>((resolve) => stream.once("close", () => resolve()));
  const caller: StalledCaller = {
    destroy: () => session.destroy(),
    async drainToClose() {
      let text = "";
      stream.on("data", (b: Buffer) => {
        text += b.toString("latin1");
      });
      stream.resume();
      await closed;
      session.close();
      return text;
    },
  };
  callers.push(caller);
  return caller;
}

let upstream: FloodInference;
let stack: Stack;
let dir: string;

beforeAll(async () => {
  upstream = await floodInference();
  dir = mkdtempSync(join(tmpdir(), "acs-stall-"));
  stack = await startStack({
    upstreamUrl: upstream.url,
    dbPath: join(dir, "acs.db"),
    model: { maxModelLen: MAX_MODEL_LEN },
    // One key opens all the unread streams: its counts are not capped here.
    maxRequestsPerKey: 0,
    maxStreamsPerKey: 0,
    streamStallMs: 300,
  });
});
afterAll(async () => {
  for (const c of callers) c.destroy();
  upstream.openGate();
  await stack.close();
  await upstream.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("streams whose callers never read", () => {
  it("do not keep a probe caller from being served, and are ended with their Holds settled once they stall", async () => {
    const ledger = stack.ledger;
    if (ledger === undefined) throw new Error("no ledger");
    const budget = 10_000_000;
    const pinKey = await ledger.createKey({ budgetTokens: budget });
    const floodKey = await ledger.createKey({ budgetTokens: budget });
    const probeKey = await ledger.createKey({ budgetTokens: 1_000_000 });
    const port = Number(new URL(stack.url).port);
    const rest = (key: string, prompt: string) =>
      stalledH1(
        port,
        "/v1/completions",
        { "content-type": "application/json", authorization: `Bearer ${key}` },
        new TextEncoder().encode(JSON.stringify({ model: "tiny", prompt, max_tokens: 30_000, stream: true })),
      );
    const path = "/acs.v1.CompletionsService/StreamCompletion";
    const rpcs = (key: string, prompt: string) => {
      const auth = { authorization: `Bearer ${key}` };
      const body = frame(
        new TextEncoder().encode(JSON.stringify({ model: "tiny", text: prompt, maxTokens: 30_000 })),
      );
      return [
        stalledH1(port, path, { "content-type": "application/connect+json", ...auth }, body),
        stalledH1(port, path, { "content-type": "application/grpc-web+json", ...auth }, body),
        stalledH2(stack.url, { "content-type": "application/grpc+json", te: "trailers", ...auth }, body),
      ];
    };

    // 128 REST streams and 6 RPC streams that Inference holds after one chunk, and 3 REST and 3
    // RPC streams that it floods once the gate opens: no caller reads.
    const pinnedCallers = [
      ...Array.from({ length: PINNED_REST }, () => rest(pinKey.key, "pin")),
      ...rpcs(pinKey.key, "pin"),
      ...rpcs(pinKey.key, "pin"),
    ];
    const floodRest = Array.from({ length: FLOOD_REST }, () => rest(floodKey.key, "flood"));
    const floodCallers = [...floodRest, ...rpcs(floodKey.key, "flood")];
    await until(
      () => upstream.pinned.open === pinnedCallers.length && upstream.floods.open === floodCallers.length,
      "every stream open at Inference",
    );
    expect(stack.admission.inFlight(pinKey.id).streams).toBe(pinnedCallers.length);

    // The probe: unary and streamed completions (each counts its prompt with /tokenize), the model
    // list and readiness — all served while every unread stream holds its upstream request.
    // A connection per request: with the gateway and this test on one busy event loop, a reused
    // idle connection can meet the gateway's keep-alive close (a reset no request caused).
    const fresh = new Agent({ pipelining: 0 });
    const probe = new OpenAI({
      apiKey: probeKey.key,
      baseURL: `${stack.url}/v1`,
      maxRetries: 0,
      fetch: ((url: string, init: RequestInit) =>
        undiciFetch(url, { ...(init as object), dispatcher: fresh })) as unknown as typeof fetch,
    });
    const probeRound = async (): Promise<number> => {
      const results = await Promise.all([
        ...Array.from({ length: 16 }, async () => {
          const c = await probe.completions.create({ model: "tiny", prompt: "probe", max_tokens: 5 });
          return c.choices[0]?.text === "ok";
        }),
        ...Array.from({ length: 4 }, async () => {
          let text = "";
          for await (const c of await probe.completions.create({
            model: "tiny",
            prompt: "probe",
            max_tokens: 5,
            stream: true,
          })) {
            text += c.choices[0]?.text ?? "";
          }
          return text === "ok";
        }),
        (async () => (await probe.models.list()).data.some((m) => m.id === "acs/fake"))(),
        (async () => (await undiciFetch(`${stack.url}/readyz`, { dispatcher: fresh })).status === 200)(),
      ]);
      return results.filter(Boolean).length;
    };
    expect(await probeRound()).toBe(22);

    // Inference now has more for the flooded streams than their connections take: each stalls and
    // is ended — Inference's request aborted, its Hold settled, its admission given back.
    upstream.openGate();
    await until(
      () => upstream.floods.aborted === floodCallers.length,
      "every stalled stream's Inference request aborted",
    );
    await until(
      () => stack.admission.inFlight(floodKey.id).requests === 0,
      "the stalled streams' admission given back",
    );
    await until(
      async () => (await ledger.usage(floodKey.id)).openHolds === 0,
      "the stalled streams' Holds settled",
    );
    expect(upstream.floods.started).toBe(floodCallers.length);
    if (process.env.DEBUG_STALL) console.log("flood chunks", upstream.floods.chunks);
    // Charged what was generated: each prompt (5 tokens) and at least one token, far below the Holds.
    const usage = await ledger.usage(floodKey.id);
    const n = floodCallers.length;
    expect(usage.heldTokens).toBe(0);
    expect(usage.spentTokens).toBeGreaterThanOrEqual(n * 6);
    expect(usage.spentTokens).toBeLessThanOrEqual(n * 5 + n + upstream.floods.chunks);
    expect(usage.availableTokens).toBe(budget - usage.spentTokens);
    // Each flooded caller's connection (or HTTP/2 stream) was ended by the gateway, without the
    // end of a stream.
    const bodies = await Promise.all(floodCallers.map((c) => c.drainToClose()));
    for (const body of bodies.slice(0, FLOOD_REST)) {
      expect(body.startsWith("HTTP/1.1 200")).toBe(true);
      expect(body).not.toContain("data: [DONE]");
    }

    // The pinned streams are quiet (nothing to write: not stalled) and still held; the probe is
    // served again; the pinned callers go away and everything is settled.
    expect(upstream.pinned.open).toBe(pinnedCallers.length);
    expect(await probeRound()).toBe(22);
    for (const c of pinnedCallers) c.destroy();
    await until(() => upstream.pinned.open === 0, "the pinned streams' Inference requests closed");
    await until(() => stack.admission.activeKeys === 0, "every admission given back");
    for (const key of [pinKey, probeKey]) {
      await until(async () => (await ledger.usage(key.id)).openHolds === 0, "every Hold settled");
    }
    await fresh.close();
  });
});
