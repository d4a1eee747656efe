/**
 * A client process of the `streams` benchmark: opens `count` SSE completions streams (one
 * connection each, node:http without keep-alive), spread evenly over `rampMs`, and checks that each
 * gets every chunk and `data: [DONE]` — or, with `protocol: "connect"`, as many Connect server
 * streams (`StreamCompletion`, connect-node's client on HTTP/1.1), each complete with every chunk.
 * Reports progress (streams open, done, failed) every 250 ms and, at the end, the failures by reason and a histogram of the gaps between consecutive chunks of
 * a stream (1 ms buckets).
 *
 * Several of these run at once (forked by ./streams.ts) because a process may hold only so many
 * sockets (`ulimit -n`, 20,000 here).
 */
import { fork } from "node:child_process";
import { Agent, request } from "node:http";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { track } from "../hotpath/processes.js";

/** One client process's job. */
export interface StreamJob {
  /** `http://127.0.0.1:PORT` of the gateway or proxy. */
  readonly url: string;
  /** Streams to open. */
  readonly count: number;
  /** The JSON request body (stream: true): `model`, `prompt` (a string) and `max_tokens` are read. */
  readonly body: string;
  /**
   * `rest` (default): `POST /v1/completions` read as SSE. `connect`: `acs.v1.CompletionsService/
   * StreamCompletion` over the Connect protocol on HTTP/1.1 (connect-node's client, JSON), the same
   * request; a stream is complete with every chunk and a normal end.
   */
  readonly protocol?: "rest" | "connect";
  /** Chunks with a choice each stream must get before `[DONE]`. */
  readonly chunks: number;
  /** Streams are opened evenly over this time, ms. */
  readonly rampMs: number;
}

/** Progress, every 250 ms. */
export interface StreamProgress {
  readonly kind: "progress";
  readonly open: number;
  readonly done: number;
  readonly failed: number;
}

/** The end of a job. */
export interface StreamReport {
  readonly kind: "report";
  readonly ok: number;
  /** Failures by reason (`status 502`, `ECONNRESET`, `12 of 30 chunks`, `no [DONE]`…). */
  readonly failures: Record<string, number>;
  /** [gap in ms, how many] of every two consecutive chunks of a stream. */
  readonly gaps: Array<[number, number]>;
  /** [ms, how many]: request sent → first chunk. */
  readonly firstChunk: Array<[number, number]>;
}

const GAP_CAP_MS = 600_000;

async function runJob(job: StreamJob, progress: (p: StreamProgress) => void): Promise<StreamReport> {
  const agent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });
  const target = new URL("/v1/completions", job.url);
  const gaps = new Map<number, number>();
  const first = new Map<number, number>();
  const add = (m: Map<number, number>, ms: number) => {
    const k = Math.min(GAP_CAP_MS, Math.round(ms));
    m.set(k, (m.get(k) ?? 0) + 1);
  };
  /** A stream's chunk counter: the first arrival timed from `start`, each later one from the last. */
  const arrivals = (start: number) => {
    let chunks = 0;
    let last = 0;
    return (): number => {
      const now = performance.now();
      if (chunks === 0) add(first, now - start);
      else add(gaps, now - last);
      last = now;
      return ++chunks;
    };
  };
  const failures: Record<string, number> = {};
  let open = 0;
  let done = 0;
  let failed = 0;
  const fail = (why: string) => {
    failures[why] = (failures[why] ?? 0) + 1;
    failed++;
  };
  const timer = setInterval(() => progress({ kind: "progress", open, done, failed }), 250);

  const one = () =>
    new Promise<void>((resolve) => {
      let settled = false;
      const end = (why: string | undefined) => {
        if (settled) return;
        settled = true;
        open--;
        if (why === undefined) done++;
        else fail(why);
        resolve();
      };
      open++;
      const sent = performance.now();
      const req = request(
        target,
        {
          method: "POST",
          agent,
          headers: { "content-type": "application/json", "content-length": Buffer.byteLength(job.body) },
        },
        (res) => {
          if (res.statusCode !== 200) {
            res.resume();
            res.on("end", () => end(`status ${res.statusCode}`));
            res.on("error", () => end(`status ${res.statusCode}`));
            return;
          }
          res.setEncoding("utf8");
          let buf = "";
          const arrived = arrivals(sent);
          let chunks = 0;
          let sawDone = false;
          res.on("data", (d: string) => {
            buf += d;
            let cut = buf.indexOf("\n\n");
            while (cut >= 0) {
              const event = buf.slice(0, cut);
              buf = buf.slice(cut + 2);
              cut = buf.indexOf("\n\n");
              if (event === "data: [DONE]") sawDone = true;
              else if (event.startsWith("data: {") && !event.includes('"choices":[]')) {
                if (event.includes('"error"')) return end("error event");
                chunks = arrived();
              }
            }
          });
          res.on("end", () => {
            if (chunks !== job.chunks) end(`${chunks} of ${job.chunks} chunks`);
            else if (!sawDone) end("no [DONE]");
            else end(undefined);
          });
          res.on("error", (err: NodeJS.ErrnoException) => end(err.code ?? err.message));
        },
      );
      req.on("error", (err: NodeJS.ErrnoException) => end(err.code ?? err.message));
      req.end(job.body);
    });

  // The Connect client (HTTP/1.1: a connection per stream open at once, as the SSE streams).
  const asked = JSON.parse(job.body) as { model: string; prompt: string; max_tokens: number };
  const client = createClient(
    CompletionsService,
    createConnectTransport({ baseUrl: job.url, httpVersion: "1.1", useBinaryFormat: false }),
  );
  const oneConnect = async (): Promise<void> => {
    open++;
    const arrived = arrivals(performance.now());
    let chunks = 0;
    let why: string | undefined;
    try {
      const stream = client.streamCompletion({
        model: asked.model,
        prompt: { case: "text", value: asked.prompt },
        maxTokens: asked.max_tokens,
      });
      for await (const m of stream) {
        if (m.choices.length > 0) chunks = arrived();
      }
      if (chunks !== job.chunks) why = `${chunks} of ${job.chunks} chunks`;
    } catch (err) {
      why = err instanceof ConnectError ? `connect ${err.code}` : String(err);
    }
    open--;
    if (why === undefined) done++;
    else fail(why);
  };

  const all: Promise<void>[] = [];
  const t0 = performance.now();
  for (let i = 0; i < job.count; i++) {
    const at = t0 + (job.count > 1 ? (job.rampMs * i) / (job.count - 1) : 0);
    const wait = at - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    all.push(job.protocol === "connect" ? oneConnect() : one());
  }
  await Promise.all(all);
  clearInterval(timer);
  progress({ kind: "progress", open, done, failed });
  agent.destroy();
  return { kind: "report", ok: done, failures, gaps: [...gaps], firstChunk: [...first] };
}

/** A forked client process. */
export interface StreamClient {
  readonly pid: number;
  /** Runs the job; `onProgress` gets its progress reports. */
  run(job: StreamJob, onProgress: (p: StreamProgress) => void): Promise<StreamReport>;
  close(): void;
}

/** Forks this file as a client process (Node with tsx's loader), ready for one job. */
export async function startStreamClient(): Promise<StreamClient> {
  const child = track(
    fork(fileURLToPath(import.meta.url), ["--client"], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
  );
  await new Promise<void>((resolve, reject) => {
    child.once("message", () => resolve());
    child.once("exit", (code) => reject(new Error(`stream client exited (${code}) before it was ready`)));
  });
  return {
    pid: child.pid as number,
    run(job, onProgress) {
      return new Promise<StreamReport>((resolve, reject) => {
        const onExit = (code: number | null) => reject(new Error(`stream client exited (${code})`));
        child.once("exit", onExit);
        const onMessage = (m: StreamProgress | StreamReport) => {
          if (m.kind === "progress") return onProgress(m);
          child.off("exit", onExit);
          child.off("message", onMessage);
          resolve(m);
        };
        child.on("message", onMessage);
        child.send(job);
      });
    },
    close() {
      if (child.connected) child.disconnect();
    },
  };
}

if (
  process.argv[1] !== undefined &&
  import.meta.url === pathToFileURL(process.argv[1]).href &&
  process.send
) {
  process.on("disconnect", () => process.exit(0));
  process.on("message", (job: StreamJob) => {
    runJob(job, (p) => process.send?.(p)).then(
      (report) => process.send?.(report),
      (err: unknown) =>
        process.send?.({
          kind: "report",
          ok: 0,
          failures: { [String(err)]: job.count },
          gaps: [],
          firstChunk: [],
        } satisfies StreamReport),
    );
  });
  process.send({ ready: true });
}
