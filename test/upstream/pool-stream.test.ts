// The replica pool's stream over scripted in-process clients: when it fails over and when it does
// not (before the first chunk, after it, for a caller that collects the stream, once at most),
// the order of what happens (each attempt's trace, its upstream request id, `onRestart`), and the
// error the caller gets.
import { create } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import {
  buildVllmRequest,
  createUpstreamPool,
  type StreamOptions,
  type UpstreamPool,
  type VllmClient,
  type VllmCompletionChunk,
  type VllmCompletionRequest,
} from "../../src/upstream/index.js";
import { chunk } from "./fake-upstream.js";

const body = buildVllmRequest(
  create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "text", value: "Hi" } }),
  { servedModelName: "served/model", maxTokens: 4, vllmXargs: {}, stream: true },
);

/** What a scripted replica does with one request: its stream, or a synchronous throw. */
type Script = (signal: AbortSignal) => AsyncIterable<VllmCompletionChunk>;

const piece = (text: string) => chunk(0, text) as unknown as VllmCompletionChunk;

/** Yields `texts`, then throws `error` when given. */
const yields = (texts: string[], error?: unknown): Script =>
  async function* () {
    for (const t of texts) {
      await new Promise((resolve) => setImmediate(resolve));
      yield piece(t);
    }
    if (error !== undefined) throw error;
  };

/** Waits for the caller's abort, then throws what the real client throws (`canceled`). */
const waitsForAbort: Script = async function* (signal) {
  await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
  throw new ApiError("canceled", "The client canceled the request.");
};

let log: string[] = [];
let pool: UpstreamPool | undefined;
afterEach(async () => {
  await pool?.close();
  pool = undefined;
  log = [];
});

/**
 * A pool over replicas named by `scripts`' keys, each answering its requests in turn by its
 * scripts; those in `down` fail their `/health` (down from the start).
 */
async function poolOf(
  scripts: Record<string, (Script | "throws")[]>,
  down: string[] = [],
): Promise<UpstreamPool> {
  const replicas = Object.entries(scripts).map(([name, list]) => {
    const client = {
      health: async () => !down.includes(name),
      close: async () => {},
      stream(b: VllmCompletionRequest, o: StreamOptions) {
        log.push(`${name} ${o.upstreamRequestId} ${b === body ? "body" : "other body"}`);
        const script = list.shift();
        if (script === undefined || script === "throws") throw new Error(`${name} cannot send`);
        return script(o.signal);
      },
    } as unknown as VllmClient;
    return { url: `http://${name}`, client };
  });
  pool = createUpstreamPool({ model: "m", replicas, healthIntervalMs: 0 });
  await pool.ready();
  return pool;
}

/** The stream's options: traced into `log`, `onRestart` when `collects`. */
function options(collects = false, signal = new AbortController().signal): StreamOptions {
  return {
    signal,
    upstreamRequestId: "r",
    trace: (call) => {
      const at = `${call.replica.slice("http://".length)}#${call.attempt}`;
      log.push(`trace ${at} ${call.upstreamRequestId} stream=${call.stream}`);
      return {
        headers: {},
        end: (error?: unknown) => log.push(`end ${at} ${error instanceof Error ? error.message : "ok"}`),
      };
    },
    ...(collects ? { onRestart: () => log.push("restart") } : {}),
  };
}

/** Reads the stream to its end into `log`; the error it ends with, if any. */
async function drain(p: UpstreamPool, o: StreamOptions): Promise<unknown> {
  try {
    for await (const c of p.stream(body, o)) log.push(`got ${c.choices[0]?.text}`);
    return undefined;
  } catch (err) {
    return err;
  }
}

const outstanding = (p: UpstreamPool) => p.replicas().map((r) => r.outstanding);

describe("poolStream's failover", () => {
  it("a failure before the first chunk goes once to another replica, with the -retry id", async () => {
    const p = await poolOf({ a: [yields([], new Error("reset"))], b: [yields(["b0", "b1"])] });
    expect(await drain(p, options())).toBeUndefined();
    expect(log).toEqual([
      "trace a#0 r stream=true",
      "a r body",
      "end a#0 reset",
      "trace b#1 r-retry stream=true",
      "b r-retry body",
      "got b0",
      "got b1",
      "end b#1 ok",
    ]);
    expect(p.failovers()).toBe(1);
    expect(outstanding(p)).toEqual([0, 0]);
    expect(p.replicas()[0]?.errors.broken).toBe(1);
  });

  it("after a chunk reached the caller: no failover, the replica's error", async () => {
    const p = await poolOf({ a: [yields(["a0"], new Error("cut"))], b: [yields(["b0"])] });
    const err = await drain(p, options());
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe("cut");
    expect(log).toEqual(["trace a#0 r stream=true", "a r body", "got a0", "end a#0 cut"]);
    expect(p.failovers()).toBe(0);
    expect(outstanding(p)).toEqual([0, 0]);
  });

  it("a caller that collects the stream: failover after chunks, onRestart told before the other's", async () => {
    const p = await poolOf({ a: [yields(["a0", "a1"], new Error("cut"))], b: [yields(["b0"])] });
    expect(await drain(p, options(true))).toBeUndefined();
    expect(log).toEqual([
      "trace a#0 r stream=true",
      "a r body",
      "got a0",
      "got a1",
      "end a#0 cut",
      "restart",
      "trace b#1 r-retry stream=true",
      "b r-retry body",
      "got b0",
      "end b#1 ok",
    ]);
    expect(p.failovers()).toBe(1);
  });

  it("fails over once at most: the second replica's failure is the caller's, a third up or not", async () => {
    const p = await poolOf({
      a: [yields([], new Error("first"))],
      b: [yields([], new Error("second"))],
      c: [yields(["c0"])],
    });
    const err = await drain(p, options(true));
    expect((err as Error).message).toBe("second");
    expect(log.filter((line) => line.startsWith("trace"))).toEqual([
      "trace a#0 r stream=true",
      "trace b#1 r-retry stream=true",
    ]);
    expect(p.failovers()).toBe(1);
    expect(outstanding(p)).toEqual([0, 0, 0]);
  });

  it("a refusal of the request itself is passed on, not sent again", async () => {
    const refusal = new ApiError("invalid_request", "no");
    const p = await poolOf({ a: [yields([], refusal)], b: [yields(["b0"])] });
    expect(await drain(p, options())).toBe(refusal);
    expect(log).toEqual(["trace a#0 r stream=true", "a r body", "end a#0 no"]);
    expect(p.failovers()).toBe(0);
    expect(p.replicas().map((r) => r.state)).toEqual(["up", "up"]);
  });

  it("the caller's abort is the caller's error: no failover, nothing counted against the replica", async () => {
    const caller = new AbortController();
    const p = await poolOf({ a: [waitsForAbort], b: [yields(["b0"])] });
    const ended = drain(p, options(true, caller.signal));
    await new Promise((resolve) => setImmediate(resolve));
    caller.abort();
    expect(await ended).toMatchObject({ code: "canceled" });
    expect(log).toEqual(["trace a#0 r stream=true", "a r body", "end a#0 The client canceled the request."]);
    expect(p.failovers()).toBe(0);
    expect(p.replicas()[0]?.errors.broken).toBe(0);
    expect(outstanding(p)).toEqual([0, 0]);
  });

  it("a client that throws at once: the attempt ends with that error, and the stream is closed", async () => {
    const p = await poolOf({ a: ["throws"], b: [yields(["b0"])] });
    const it = p.stream(body, options())[Symbol.asyncIterator]();
    await expect(it.next()).rejects.toThrow("a cannot send");
    expect(await it.next()).toEqual({ value: undefined, done: true });
    expect(log).toEqual(["trace a#0 r stream=true", "a r body", "end a#0 a cannot send"]);
    expect(outstanding(p)).toEqual([0, 0]);
  });

  it("no replica up: the 503 at the first next(), not before; nothing traced", async () => {
    const p = await poolOf({ a: [yields(["a0"])] }, ["a"]);
    expect(p.replicas()[0]?.state).toBe("down");
    const it = p.stream(body, options())[Symbol.asyncIterator]();
    expect(log).toEqual([]);
    await expect(it.next()).rejects.toMatchObject({ code: "upstream_unavailable" });
    expect(await it.next()).toEqual({ value: undefined, done: true });
    expect(log).toEqual([]);
  });
});
