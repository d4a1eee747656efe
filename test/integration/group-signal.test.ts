// Shutdown as a terminal or a supervisor does it: a signal to the gateway's whole process group
// (Ctrl-C, `kill -- -PGID`, systemd's KillMode=control-group). A real gateway (src/main.ts,
// ACS_WORKERS=2, the embedded reference engine) is started as the leader of a process group of its
// own; the signal reaches the primary and both workers at once. It counts once: a stream running
// finishes normally during the drain, a request in the drain delay is served, the engine is stopped
// by the gateway after the workers closed (no restart, no error), and nothing of the group is left.
// A generation cut short (the engine killed, a stream that ends without [DONE] or with
// finish_reason "abort") never ends with a normal finish_reason: the stream gets the in-band error
// event and a unary call its error envelope.
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { freePort } from "../helpers/processes.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { chunk, type FakeUpstream, sse, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

interface LogLine {
  level: number;
  msg: string;
  pid: number;
  [key: string]: unknown;
}

interface Gateway {
  child: ChildProcess;
  url: string;
  lines: LogLine[];
  enginePid: number;
  exited: Promise<number | null>;
  stderr(): string;
}

const gateways: Gateway[] = [];
afterEach(() => {
  for (const g of gateways.splice(0)) {
    if (g.child.exitCode === null && g.child.signalCode === null) signalGroup(g.child.pid ?? 0, "SIGKILL");
    if (exists(g.enginePid)) process.kill(g.enginePid, "SIGKILL");
  }
});

/** This process's environment without the gateway's variables, plus `env`. */
function envWith(env: Record<string, string>): NodeJS.ProcessEnv {
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(
      ([k]) => !k.startsWith("ACS_") && k !== "PORT" && k !== "HOST" && !k.startsWith("npm_"),
    ),
  );
  return { ...clean, ...env };
}

/** True while a process with this pid exists. */
function exists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** True while a process of group `pgid` exists. */
function groupExists(pgid: number): boolean {
  return signalGroup(pgid, 0);
}

function signalGroup(pgid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * `node --import tsx src/main.ts` with two workers and the embedded engine (llama-8b: slow enough
 * that a 900-token stream runs for seconds), leading a process group of its own (as a shell's
 * job does); resolves once the gateway listens.
 */
async function startGateway(): Promise<Gateway> {
  const port = await freePort();
  const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
    detached: true,
    env: envWith({
      PORT: String(port),
      ACS_WORKERS: "2",
      ACS_ENGINE_PRESET: "llama-8b",
      // The drain delay is when a new request must still be served; the grace is a liveness
      // bound far above the stream's time (past it the stream would be cut: the test fails).
      ACS_DRAIN_DELAY_MS: "3000",
      ACS_SHUTDOWN_GRACE_MS: "120000",
      ACS_LOG_LEVEL: "info",
    }),
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr?.setEncoding("utf8").on("data", (d: string) => {
    stderr += d;
  });
  const lines: LogLine[] = [];
  createInterface({ input: child.stdout! }).on("line", (line) => {
    if (line.startsWith("{")) lines.push(JSON.parse(line) as LogLine);
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const gateway: Gateway = {
    child,
    url: `http://127.0.0.1:${port}`,
    lines,
    enginePid: 0,
    exited,
    stderr: () => stderr,
  };
  gateways.push(gateway);
  await until(
    () => lines.some((l) => l.msg.startsWith("acs-gateway listening")) || child.exitCode !== null,
    "the gateway listens",
    50,
  );
  expect(child.exitCode, stderr).toBeNull();
  gateway.enginePid = lines.find((l) => l.msg.startsWith("reference engine started"))?.enginePid as number;
  expect(gateway.enginePid).toBeGreaterThan(0);
  return gateway;
}

const completionBody = (stream: boolean, maxTokens: number) =>
  JSON.stringify({
    model: "llama-8b",
    prompt: "Once upon a time",
    max_tokens: maxTokens,
    ignore_eos: true,
    stream,
  });

/** A streamed completion of 900 tokens, read as it comes. */
async function openStream(url: string) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: completionBody(true, 900),
  });
  expect(res.status).toBe(200);
  let text = "";
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  const done = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return text + decoder.decode();
      text += decoder.decode(value, { stream: true });
    }
  })();
  return { events: () => text.split("\n\n").length - 1, done };
}

type Chunk = { choices?: { finish_reason: string | null }[]; error?: { code: string } };

const finishReasons = (chunks: Chunk[]) =>
  chunks.flatMap((c) => (c.choices ?? []).map((ch) => ch.finish_reason)).filter((f) => f !== null);

describe.each(["SIGTERM", "SIGINT"] as const)(
  "%s to the gateway's process group (ACS_WORKERS=2)",
  (signal) => {
    it("drains once: the stream finishes, the engine stops after the workers, nothing is left", async () => {
      const gw = await startGateway();
      const pgid = gw.child.pid!;
      const stream = await openStream(gw.url);
      await until(() => stream.events() >= 3, "the stream has started");
      const before = gw.lines.length;
      process.kill(-pgid, signal);

      // A request in the drain delay (sent at once, answered at once): still served, the engine too.
      const unary = fetch(`${gw.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: completionBody(false, 3),
      }).then(async (res) => ({ status: res.status, body: (await res.json()) as Chunk }));
      unary.catch(() => undefined); // asserted below, after the stream

      // The stream runs to its end: 900 tokens, finish_reason "length", [DONE], no error event.
      const chunks = sseChunks<Chunk>(await stream.done);
      expect(chunks.filter((c) => c.error !== undefined)).toEqual([]);
      expect(finishReasons(chunks)).toEqual(["length"]);
      const { status, body } = await unary;
      expect(status, JSON.stringify(body)).toBe(200);
      expect(body.choices?.[0]?.finish_reason).toBe("length");

      expect(await gw.exited, gw.stderr()).toBe(0);
      await until(() => !groupExists(pgid), "the process group is gone");
      await until(() => !exists(gw.enginePid), "the engine is gone");

      const after = gw.lines.slice(before);
      const msgs = after.map((l) => l.msg);
      expect(msgs.filter((m) => m.includes("second signal"))).toEqual([]);
      expect(after.filter((l) => l.level >= 50)).toEqual([]);
      // The engine served through the drain and was stopped once both workers had closed.
      expect(msgs.filter((m) => m.startsWith("reference engine exited"))).toEqual([]);
      expect(after.filter((l) => / is down/.test(l.msg))).toEqual([]);
      const stopped = msgs.indexOf("reference engine stopped");
      expect(stopped).toBeGreaterThan(-1);
      expect(msgs.filter((m) => m === "worker exited")).toHaveLength(2);
      expect(msgs.lastIndexOf("worker exited")).toBeLessThan(stopped);
      // Each worker drained once.
      expect(after.filter((l) => l.msg === "shutting down")).toHaveLength(2);
    });
  },
);

describe("the embedded engine killed mid-generation (ACS_WORKERS=2)", () => {
  it("the stream gets the in-band error and a unary call its envelope, never a normal finish_reason", async () => {
    const gw = await startGateway();
    const unary = fetch(`${gw.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: completionBody(false, 900),
    });
    const stream = await openStream(gw.url);
    await until(() => stream.events() >= 3, "the stream has started");
    process.kill(gw.enginePid, "SIGKILL");

    const chunks = sseChunks<Chunk>(await stream.done);
    expect(chunks.at(-1)?.error?.code).toBe("upstream_error");
    expect(finishReasons(chunks)).toEqual([]);
    // Keys off, a unary call is one non-streamed answer: the connection broken before it began
    // is the pool's 503 (src/upstream/vllm/map-upstream-error.ts), never a 200 with the text so far.
    const res = await unary;
    const body = (await res.json()) as { error?: { code: string } };
    expect([502, 503], JSON.stringify(body)).toContain(res.status);
    expect(["upstream_error", "upstream_unavailable"]).toContain(body.error?.code);

    // The gateway still ends cleanly once the engine is back.
    await until(
      () => gw.lines.some((l) => l.msg === "reference engine restarted"),
      "the engine restarted",
      50,
    );
    const enginePid = gw.lines.find((l) => l.msg === "reference engine restarted")?.enginePid as number;
    process.kill(-gw.child.pid!, "SIGTERM");
    expect(await gw.exited, gw.stderr()).toBe(0);
    await until(() => !exists(enginePid), "the restarted engine is gone");
  });
});

describe("the embedded engine never outlives the gateway", () => {
  it("SIGKILL to the gateway's process group: the engine, in a group of its own, exits too", async () => {
    const gw = await startGateway();
    process.kill(-gw.child.pid!, "SIGKILL");
    await gw.exited;
    await until(() => !exists(gw.enginePid), "the engine is gone (its stdin ended)");
  });
});

describe("a generation the upstream cuts short", () => {
  const dir = mkdtempSync(join(tmpdir(), "acs-cut-"));
  let upstream: FakeUpstream | undefined;
  let stack: Stack | undefined;
  afterAll(async () => {
    await stack?.close();
    await upstream?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  // The prompt picks the cut: a clean end after two tokens without [DONE], or vLLM's "abort".
  const answer = (prompt: string): string => {
    const events = [chunk(0, "a", null, { token_ids: [1] }), chunk(0, "b", null, { token_ids: [2] })];
    if (prompt === "abort") events.push(chunk(0, "", "abort", { token_ids: [] }));
    return sse(events, prompt !== "no-done");
  };

  const start = async (): Promise<{ stack: Stack; key: string }> => {
    upstream = await startFakeUpstream(
      withVllmOps((req, res, body) => {
        if (req.url === "/tokenize") {
          res.setHeader("content-type", "application/json");
          res.end(JSON.stringify({ count: 2, max_model_len: 512, tokens: [1, 2] }));
          return;
        }
        res.setHeader("content-type", "text/event-stream");
        res.end(answer((JSON.parse(body) as { prompt: string }).prompt));
      }),
    );
    // Keys on: a unary call is Inference's stream collected (proto/API.md §5), so both surfaces
    // read the same cut stream.
    stack = await startStack({ upstreamUrl: upstream.url, dbPath: join(dir, "cut.db") });
    const { key } = await stack.ledger!.createKey({ budgetTokens: 100_000, name: "cut" });
    return { stack, key };
  };
  let started: Promise<{ stack: Stack; key: string }> | undefined;

  it.each(["no-done", "abort"])(
    "%s: the stream's in-band error, a unary call's 502 envelope",
    async (prompt) => {
      started ??= start();
      const { stack, key } = await started;
      const call = (stream: boolean) =>
        fetch(`${stack.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
          body: JSON.stringify({ model: stack.alias, prompt, max_tokens: 8, stream }),
        });
      const streamed = await call(true);
      expect(streamed.status).toBe(200);
      const chunks = sseChunks<Chunk>(await streamed.text());
      expect(chunks.at(-1)?.error?.code).toBe("upstream_error");
      expect(finishReasons(chunks)).toEqual([]);
      const unary = await call(false);
      const body = (await unary.json()) as { error?: { code: string } };
      expect(unary.status, JSON.stringify(body)).toBe(502);
      expect(body.error?.code).toBe("upstream_error");
    },
  );
});
