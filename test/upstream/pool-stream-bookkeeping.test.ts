// The replica pool's stream iterator past its first chunk (a plain promise, no async frame) and a
// replica's attempts kept in a Set: a take-out moves only what has no output, and every way a
// stream ends — to its end, return() at any point, the caller's abort — gives its replica's
// outstanding count back exactly once.
import { create } from "@bufbuild/protobuf";
import { afterEach, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import {
  buildVllmRequest,
  createUpstreamPool,
  createVllmClient,
  type UpstreamPool,
  type VllmCompletionChunk,
} from "../../src/upstream/index.js";
import { configDefaults } from "../helpers/config-defaults.js";
import { until } from "../helpers/hang-guard.js";
import { chunk, type FakeUpstream, startFakeUpstream } from "./fake-upstream.js";

/** The Inference clients' silence bound: the configuration's default (ACS_UPSTREAM_HEADERS_TIMEOUT_MS). */
const silenceTimeoutMs = configDefaults.upstreamHeadersTimeoutMs;

const request = create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "text", value: "Hi" } });
const streamBody = buildVllmRequest(request, {
  servedModelName: "served/model",
  maxTokens: 4,
  vllmXargs: {},
  stream: true,
});

/** A scripted replica: "held" requests send their first chunk and wait for `release()`. */
interface Replica {
  up: FakeUpstream;
  health: "ok" | "503";
  /** X-Request-Id of each completion request it received. */
  ids: string[];
  release: () => void;
}

async function startReplica(name: string, opts: { held?: string; silent?: string } = {}): Promise<Replica> {
  let release: () => void = () => {};
  const released = new Promise<void>((r) => {
    release = r;
  });
  const r: Replica = { up: undefined as unknown as FakeUpstream, health: "ok", ids: [], release };
  r.up = await startFakeUpstream(async (req, res) => {
    if (req.url === "/health") {
      res.statusCode = r.health === "ok" ? 200 : 503;
      res.end();
      return;
    }
    if (req.url === "/v1/models") {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify({ object: "list", data: [{ id: "served/model", max_model_len: 512 }] }));
      return;
    }
    const id = String(req.headers["x-request-id"]);
    r.ids.push(id);
    res.writeHead(200, { "content-type": "text/event-stream" });
    if (id === opts.silent) return; // the head, never a chunk
    for (let i = 0; i < 3; i++) {
      res.write(`data: ${JSON.stringify(chunk(0, `${name}${i}`, i === 2 ? "length" : null))}\n\n`);
      if (i === 0 && id === opts.held) await released;
      else await new Promise((resolve) => setImmediate(resolve));
    }
    res.end("data: [DONE]\n\n");
  });
  return r;
}

let replicas: Replica[] = [];
let pool: UpstreamPool | undefined;
afterEach(async () => {
  await pool?.close();
  for (const r of replicas) r.release();
  for (const r of replicas) await r.up.close();
  replicas = [];
  pool = undefined;
});

const text = (res: IteratorResult<VllmCompletionChunk>) =>
  res.done === true ? "" : res.value.choices.map((c) => c.text).join("");

async function rest(it: AsyncIterator<VllmCompletionChunk>): Promise<string> {
  let all = "";
  for (;;) {
    const res = await it.next();
    if (res.done === true) return all;
    all += text(res);
  }
}

it("a take-out: the stream with output goes on to its end, the one without goes to the other replica", async () => {
  replicas = [await startReplica("a", { held: "s1", silent: "s2" }), await startReplica("b")];
  const [a, b] = replicas as [Replica, Replica];
  b.health = "503"; // down at start, so that both requests go to a
  const p = createUpstreamPool({
    model: "m",
    replicas: replicas.map((r) => ({
      url: r.up.url,
      client: createVllmClient({ baseUrl: r.up.url, silenceTimeoutMs }),
    })),
    healthIntervalMs: 20,
    backoff: { initialMs: 20, maxMs: 20 },
    checkTimeoutMs: 1000,
  });
  pool = p;
  await p.ready();
  expect(p.replicas().map((r) => r.state)).toEqual(["up", "down"]);

  const s1 = p
    .stream(streamBody, { signal: new AbortController().signal, upstreamRequestId: "s1" })
    [Symbol.asyncIterator]();
  expect(text(await s1.next())).toBe("a0"); // a held: its next chunks wait for release()
  const s2 = rest(
    p
      .stream(streamBody, { signal: new AbortController().signal, upstreamRequestId: "s2" })
      [Symbol.asyncIterator](),
  );
  await until(() => a.ids.includes("s2"), "s2 waits on a without output");
  b.health = "ok";
  await until(() => p.replicas()[1]?.state === "up", "b is back");
  a.health = "503";
  await until(() => p.replicas()[0]?.state === "down", "a is taken out");

  expect(await s2).toBe("b0b1b2");
  expect(b.ids).toEqual(["s2-retry"]);
  expect(p.failovers()).toBe(1);
  a.release(); // s1 was still open on a when a was taken out
  expect(await rest(s1)).toBe("a1a2");
  expect(p.replicas().map((r) => r.outstanding)).toEqual([0, 0]);
});

it("outstanding is given back once: return() before, at and after the first chunk, at the end, and the caller's abort", async () => {
  replicas = [await startReplica("a", { held: "abort" })];
  const p = createUpstreamPool({
    model: "m",
    replicas: replicas.map((r) => ({
      url: r.up.url,
      client: createVllmClient({ baseUrl: r.up.url, silenceTimeoutMs }),
    })),
    healthIntervalMs: 0,
  });
  pool = p;
  await p.ready();
  const outstanding = () => p.replicas()[0]?.outstanding;
  const open = (id: string, signal = new AbortController().signal) =>
    p.stream(streamBody, { signal, upstreamRequestId: id })[Symbol.asyncIterator]();

  await open("r0").return?.();
  expect(outstanding()).toBe(0);

  const r1 = open("r1");
  await r1.next();
  expect(outstanding()).toBe(1);
  await r1.return?.();
  await r1.return?.();
  expect(outstanding()).toBe(0);

  const r2 = open("r2");
  await r2.next();
  await r2.next();
  await r2.return?.();
  expect(outstanding()).toBe(0);

  const r3 = open("r3");
  expect(await rest(r3)).toBe("a0a1a2");
  await r3.return?.();
  expect(await r3.next()).toEqual({ value: undefined, done: true });
  expect(outstanding()).toBe(0);

  const caller = new AbortController();
  const r4 = open("abort", caller.signal);
  expect(text(await r4.next())).toBe("a0");
  const pending = r4.next(); // past the first chunk: the replica's own promise
  caller.abort();
  await expect(pending).rejects.toMatchObject({ code: "canceled" });
  expect(outstanding()).toBe(0);
  expect(await r4.next()).toEqual({ value: undefined, done: true });
  await r4.return?.();
  expect(outstanding()).toBe(0);
  expect(p.replicas()[0]?.state).toBe("up");
});
