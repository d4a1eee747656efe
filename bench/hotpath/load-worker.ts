/**
 * The load generator of the hot-path benchmark, in a process of its own (forked with IPC by
 * {@link startLoadWorker}) so that its CPU is not the servers' and theirs is not its own.
 *
 * One job = one autocannon run: `warmupS` seconds not counted, then a window of `measureS` seconds
 * in which every response is timed (autocannon's own histogram keeps whole milliseconds; the
 * `response` event gives the exact time) and the CPU time of the listed processes is read from
 * /proc before and after. Bodies are fixed, or fresh for every request (`fresh`: a short text
 * prompt or a token-id prompt never sent before, so that no cache helps; `alternate`: the two in
 * turn on each connection, each kind's latency kept apart, so that the two are compared within the
 * same window rather than across two cells a few seconds apart).
 */
import { fork } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath, pathToFileURL } from "node:url";
import autocannon from "autocannon";
import { processCpuSeconds, track } from "./processes.js";

/** processCpuSeconds, or NaN when the process is gone. */
function cpuOrNaN(pid: number): number {
  try {
    return processCpuSeconds(pid);
  } catch {
    return Number.NaN;
  }
}

/** The kinds of a fresh prompt. */
export type PromptKind = "text" | "ids";

/**
 * A request body: fixed text, or a new prompt for every request on top of `base` — of one kind, or
 * of both in turn (`alternate`: text, ids, text, … on each connection).
 */
export type LoadBody = string | { fresh: PromptKind | "alternate"; base: Record<string, unknown> };

/** One measured cell. */
export interface LoadJob {
  /** Origin, e.g. `http://127.0.0.1:8080`. */
  url: string;
  /** @default "/v1/completions" */
  path?: string;
  /** `GET` sends no body (`body` is then ignored). @default "POST" */
  method?: "GET" | "POST";
  headers: Record<string, string>;
  body: LoadBody;
  connections: number;
  warmupS: number;
  measureS: number;
  /** Processes whose CPU time is read at the window's start and end. */
  cpuPids: number[];
}

/** What one job measured, over its window only (errors: over the whole run). */
export interface LoadResult {
  /** Latency of 2xx responses, ms (request written → response complete); NaN without any. */
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  /** 2xx responses completed in the window. */
  count: number;
  /** count / windowS. */
  rps: number;
  windowS: number;
  non2xx: number;
  errors: number;
  timeouts: number;
  /** CPU seconds each of `cpuPids` used in the window, by pid. */
  cpuS: Record<number, number>;
  /**
   * With `fresh: "alternate"`: the latency of each kind's 2xx responses in the window, ms (NaN
   * without any), and how many there were.
   */
  byKind?: Record<PromptKind, { p50Ms: number; count: number }>;
  /** The window on the machine's monotonic clock (`process.hrtime`, that of CPU profiles), µs. */
  windowStartUs: number;
  windowEndUs: number;
}

const monotonicUs = (): number => Number(process.hrtime.bigint() / 1000n);

function percentile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] as number;
}

/**
 * A body generator: a prompt never used before, either short text (6 words: 7 tokens with BOS) or
 * 7 token ids.
 */
function freshBodies(kind: PromptKind, base: Record<string, unknown>): () => string {
  const tag = randomBytes(4).toString("hex");
  let n = 0;
  return () => {
    n++;
    const prompt =
      kind === "text"
        ? `Question ${tag} ${n}: the sky is`
        : [128000, 14924, 25, n % 100_000, 279, 13180, 374];
    return JSON.stringify({ ...base, prompt });
  };
}

/** autocannon's requests for a fresh body: one kind, or text then ids in turn (`alternate`). */
function freshRequests(spec: { fresh: PromptKind | "alternate"; base: Record<string, unknown> }) {
  const kinds: PromptKind[] = spec.fresh === "alternate" ? ["text", "ids"] : [spec.fresh];
  return kinds.map((kind) => {
    const body = freshBodies(kind, spec.base);
    return { setupRequest: (req: autocannon.Request) => ({ ...req, body: body() }) };
  });
}

/**
 * The kind of the request a response answers, with `alternate`: autocannon emits `response`
 * before its client moves to its next request, so the client's request index (0: text, 1: ids) is
 * that of the answered one (no pipelining). Reads autocannon's client internals (`requestIterator`).
 */
function answeredKind(client: unknown): PromptKind {
  const index = (client as { requestIterator?: { currentRequestIndex?: unknown } }).requestIterator
    ?.currentRequestIndex;
  if (index !== 0 && index !== 1) throw new Error("autocannon's client no longer exposes its request index");
  return index === 0 ? "text" : "ids";
}

/** Runs one job in this process. */
export function runLoad(job: LoadJob): Promise<LoadResult> {
  const samples: number[] = [];
  let measuring = false;
  let count = 0;
  let non2xx = 0;
  const get = job.method === "GET";
  const fresh = get || typeof job.body === "string" ? undefined : job.body;
  const alternate = fresh?.fresh === "alternate";
  const kindSamples: Record<PromptKind, number[]> = { text: [], ids: [] };
  let finished: (err: Error | null, result: autocannon.Result) => void = () => {};
  const instance = autocannon(
    {
      url: job.url + (job.path ?? "/v1/completions"),
      method: get ? "GET" : "POST",
      headers: get ? job.headers : { "content-type": "application/json", ...job.headers },
      connections: job.connections,
      duration: job.warmupS + job.measureS + 600, // stopped by the window's timer below
      ...(get ? {} : fresh === undefined ? { body: job.body as string } : { requests: freshRequests(fresh) }),
    },
    (err, result) => finished(err, result),
  );
  instance.on("response", (client, statusCode, _bytes, responseTime) => {
    if (statusCode < 200 || statusCode > 299) {
      non2xx++;
      return;
    }
    if (!measuring) return;
    count++;
    samples.push(responseTime);
    if (alternate) kindSamples[answeredKind(client)].push(responseTime);
  });
  return new Promise((resolve, reject) => {
    let cpu0: number[] = [];
    let t0 = 0;
    let windowS = 0;
    let windowStartUs = 0;
    let windowEndUs = 0;
    let cpuS: Record<number, number> = {};
    setTimeout(() => {
      cpu0 = job.cpuPids.map(cpuOrNaN);
      t0 = performance.now();
      windowStartUs = monotonicUs();
      measuring = true;
      setTimeout(() => {
        measuring = false;
        windowS = (performance.now() - t0) / 1000;
        windowEndUs = monotonicUs();
        cpuS = Object.fromEntries(job.cpuPids.map((pid, i) => [pid, cpuOrNaN(pid) - (cpu0[i] as number)]));
        instance.stop();
      }, job.measureS * 1000);
    }, job.warmupS * 1000);
    finished = (err, result) => {
      if (err) return reject(err);
      if (windowS === 0) return reject(new Error("autocannon ended before the measurement window"));
      const sorted = Float64Array.from(samples).sort();
      const kindLatency = (xs: number[]) => ({
        p50Ms: percentile(Float64Array.from(xs).sort(), 0.5),
        count: xs.length,
      });
      resolve({
        ...(alternate
          ? { byKind: { text: kindLatency(kindSamples.text), ids: kindLatency(kindSamples.ids) } }
          : {}),
        p50Ms: percentile(sorted, 0.5),
        p99Ms: percentile(sorted, 0.99),
        meanMs: samples.length === 0 ? Number.NaN : samples.reduce((a, b) => a + b, 0) / samples.length,
        count,
        rps: count / windowS,
        windowS,
        non2xx,
        errors: result.errors,
        timeouts: result.timeouts,
        cpuS,
        windowStartUs,
        windowEndUs,
      });
    };
  });
}

/** A forked load worker; `run` sends it one job at a time. */
export interface LoadWorker {
  readonly pid: number;
  run(job: LoadJob): Promise<LoadResult>;
  close(): void;
}

/** Forks this file as a load worker (Node with tsx's loader) and resolves once it is ready. */
export async function startLoadWorker(): Promise<LoadWorker> {
  const child = track(
    fork(fileURLToPath(import.meta.url), ["--worker"], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
  );
  await new Promise<void>((resolve, reject) => {
    child.once("message", () => resolve());
    child.once("exit", (code) => reject(new Error(`load worker exited (${code}) before it was ready`)));
  });
  let queue: Promise<unknown> = Promise.resolve();
  return {
    pid: child.pid as number,
    run(job) {
      const next = queue.then(
        () =>
          new Promise<LoadResult>((resolve, reject) => {
            const onExit = (code: number | null) => reject(new Error(`load worker exited (${code})`));
            child.once("exit", onExit);
            child.once("message", (m: { ok: true; result: LoadResult } | { ok: false; error: string }) => {
              child.off("exit", onExit);
              // NaN (no 2xx response in the window) travels over IPC as null.
              if (m.ok)
                resolve({
                  ...m.result,
                  p50Ms: m.result.p50Ms ?? Number.NaN,
                  p99Ms: m.result.p99Ms ?? Number.NaN,
                  meanMs: m.result.meanMs ?? Number.NaN,
                  ...(m.result.byKind === undefined
                    ? {}
                    : {
                        byKind: {
                          text: { ...m.result.byKind.text, p50Ms: m.result.byKind.text.p50Ms ?? Number.NaN },
                          ids: { ...m.result.byKind.ids, p50Ms: m.result.byKind.ids.p50Ms ?? Number.NaN },
                        },
                      }),
                });
              else reject(new Error(`load worker: ${m.error}`));
            });
            child.send(job);
          }),
      );
      queue = next.catch(() => {});
      return next;
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
  process.on("message", (job: LoadJob) => {
    runLoad(job).then(
      (result) => process.send?.({ ok: true, result }),
      (err: unknown) => process.send?.({ ok: false, error: String(err) }),
    );
  });
  process.send({ ready: true });
}
