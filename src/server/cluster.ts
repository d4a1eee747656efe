// ACS_WORKERS=N (N > 1): N gateway processes on one port (node:cluster). The primary starts the
// embedded reference engine once (when there is one), releases the Holds an earlier run left on a
// SQLite file, forks the workers (the first alone, so that a port in use is one line and exit code
// 2), restarts a worker that dies or whose event loop stalled (ACS_WORKER_TIMEOUT_MS), aggregates
// /metrics for the worker a scrape reaches (src/server/worker-metrics.ts: no counter goes back when
// a worker dies or misses a scrape), and on SIGTERM/SIGINT has every worker run its normal close
// path before it exits (told over IPC: the worker may have had the same signal from the process
// group, which is one shutdown, not a second signal). Each worker is the single-process gateway of src/main.ts with a stable
// instance id of its own in the Budget store.
// The per-key caps (proto/API.md §9) are counted by the primary for every worker: a worker asks it
// for each keyed request's place and gives the place back when the request ends.
import cluster, { type Worker } from "node:cluster";
import { hostname } from "node:os";
import type { Logger } from "pino";
import { AggregatorRegistry, Counter, Gauge, Registry } from "prom-client";
import { type Config, dbOpenError, type ModelConfig } from "../config/index.js";
import { ApiError } from "../errors/index.js";
import {
  type Admission,
  type AdmissionDemand,
  type AdmissionLimits,
  type AdmissionTicket,
  admissionLimitsFrom,
  createAdmission,
  type KeyInFlight,
  rateLimited,
} from "../service/admission.js";
import type { GatewayMetrics } from "./metrics.js";
import { listenOps, opsListenRefusal, type Readiness } from "./ops-server.js";
import { onShutdownSignals, type ShutdownHandlers } from "./shutdown-signals.js";
import { type MetricsJson, WorkerMetricsMemory } from "./worker-metrics.js";

/** The environment variable that carries a worker's settings from the primary (JSON). */
const WORKER_ENV = "ACS_CLUSTER_WORKER";

/** What the primary hands each worker at fork (JSON in {@link WORKER_ENV}). */
interface WorkerSettings {
  /** 1..N: the worker's place; a restarted worker takes the place of the one that died. */
  readonly slot: number;
  /** Its name in the Budget store: `<ACS_INSTANCE_ID or host:pid:random>/w<slot>`. */
  readonly instanceId: string;
  /** The embedded engine's model (the primary runs the engine); undefined with ACS_MODELS. */
  readonly embeddedModel: ModelConfig | undefined;
  /** Whether the embedded engine was alive when this worker was forked. */
  readonly engineAlive: boolean;
}

/** What a worker tells the primary once it listens. */
interface ListeningInfo {
  readonly url: string;
  readonly port: number;
  readonly models: unknown;
}

type ToPrimary =
  | { readonly acs: "listening"; readonly info: ListeningInfo }
  | { readonly acs: "scrape"; readonly id: number }
  | { readonly acs: "metrics"; readonly id: number; readonly metrics: MetricsJson }
  | { readonly acs: "admit"; readonly id: number; readonly keyId: string; readonly demand: AdmissionDemand }
  | { readonly acs: "release"; readonly ticket: number }
  | { readonly acs: "readiness"; readonly readiness: Readiness }
  | { readonly acs: "starting" };

/**
 * The primary's answer to an `admit`: a ticket and its Inference requests, or the refusal's
 * message; neither when the primary failed to count it (the worker then counts it alone).
 */
type AdmitAnswer = {
  readonly acs: "admit";
  readonly id: number;
  readonly ticket?: number;
  readonly upstreamRequests?: number;
  readonly refused?: string;
};

type ToWorker =
  | { readonly acs: "scrape"; readonly id: number; readonly text?: string; readonly error?: string }
  | { readonly acs: "metrics"; readonly id: number }
  | { readonly acs: "engine"; readonly alive: boolean }
  /** Drain and close (`now`: end the calls in flight at once), for the primary's `signal`. */
  | { readonly acs: "shutdown"; readonly signal: string; readonly now: boolean }
  | AdmitAnswer;

function isAcsMessage(m: unknown): m is { acs: string } {
  return typeof m === "object" && m !== null && typeof (m as { acs?: unknown }).acs === "string";
}

/** A cluster worker's side: what src/main.ts changes when it runs as one of ACS_WORKERS. */
export interface ClusterWorker {
  readonly slot: number;
  readonly instanceId: string;
  /** The embedded engine's model, started by the primary; undefined with ACS_MODELS. */
  readonly embeddedModel: ModelConfig | undefined;
  /** False once the primary saw the embedded engine exit (readiness). */
  engineAlive(): boolean;
  /**
   * Registers `acs_worker_requests_total{worker}` (this worker's requests, read from
   * `acs_requests_total` at each scrape) and makes `metrics.registry` the one the primary reads.
   */
  registerMetrics(metrics: GatewayMetrics): void;
  /**
   * The Prometheus text of every worker's metrics aggregated by the primary (prom-client
   * AggregatorRegistry: counters and histograms summed, per-worker series kept apart by their
   * `worker` label), plus the primary's `acs_cluster_*`. Rejects with ApiError 503
   * `upstream_unavailable` when the primary does not answer within 10 s (or fails): this worker's
   * own counters alone would read as counter resets.
   */
  scrape(): Promise<string>;
  /** Tells the primary this worker listens (the primary logs the one "listening" line). */
  listening(info: ListeningInfo): void;
  /**
   * Tells the primary this worker's readiness (what its GET /readyz answers) now, at each change
   * (checked every {@link READINESS_CHECK_MS}) and at least once a second: the primary answers
   * /readyz on the ops port (ACS_OPS_PORT) from these, /healthz from how recent they are
   * ({@link WORKER_SILENT_MS}), and kills a worker silent for ACS_WORKER_TIMEOUT_MS.
   */
  reportReadiness(read: () => Readiness): void;
  /**
   * The per-key caps counted across every worker: each admit asks the primary (one IPC round
   * trip) and each release tells it. `limits` must be the primary's (both read the configuration).
   * `inFlight` and `activeKeys` are this worker's share. If the primary does not answer within
   * {@link ADMIT_ANSWER_MS} (or the channel is gone), this worker counts its requests alone, with
   * a warning, until the primary answers again: a place it grants meanwhile is given back at once.
   */
  admission(limits: AdmissionLimits): Admission;
  /**
   * The primary's shutdown instructions: `drain` on its first signal, `now` on a second one. The
   * worker's own SIGTERM/SIGINT (the same signal sent to the process group) is the same shutdown,
   * not a second one. An instruction that came before this call is passed on at once.
   */
  onShutdown(handlers: ShutdownHandlers): void;
}

/**
 * How long a worker waits for the primary's answer to an admit before counting alone, ms. The
 * primary answers within a millisecond when it runs; this bounds what a stopped one costs a request.
 */
export const ADMIT_ANSWER_MS = 1000;

/** How often a worker checks its readiness for the primary's ops port, ms. */
export const READINESS_CHECK_MS = 250;

/**
 * A worker not heard from this long (its event loop stalled, or stopped) does not count as live
 * on the ops port's /healthz, ms. Far above a busy loop's lag (seconds at most under the streams
 * bench's ramp), so that a loaded gateway is not restarted for being loaded.
 */
export const WORKER_SILENT_MS = 10_000;

/** A worker still starting is killed after this many times ACS_WORKER_TIMEOUT_MS of silence. */
const STARTING_TIMEOUT_FACTOR = 2;

/** A worker that has not reported since its fork is killed after this many times ACS_WORKER_TIMEOUT_MS. */
const FIRST_REPORT_TIMEOUT_FACTOR = 4;

/** How often a worker that does not listen yet tells the primary it is alive, ms. */
const STARTING_REPORT_MS = 1000;

/** How often the primary checks its workers' silence against ACS_WORKER_TIMEOUT_MS, ms. */
const WATCHDOG_TICK_MS = 1000;

/** This process's worker side when it is a cluster worker of the gateway; else undefined. */
export function joinCluster(logger: Logger): ClusterWorker | undefined {
  const raw = process.env[WORKER_ENV];
  if (!cluster.isWorker || raw === undefined) return undefined;
  const settings = JSON.parse(raw) as WorkerSettings;
  let engineAlive = settings.engineAlive;
  let registry: Registry | undefined;
  let nextId = 0;
  const scrapes = new Map<number, (m: ToWorker & { acs: "scrape" }) => void>();
  // A send after the primary died fails: told to the callback (then 'disconnect' follows), not
  // thrown as an 'error' on `process`, which would end this worker with an uncaught error.
  const send = (m: ToPrimary) => {
    if (process.connected) process.send?.(m, undefined, undefined, () => undefined);
  };
  // The admission's answers; before it exists, any place the primary gives goes back at once.
  let admitAnswered = (m: AdmitAnswer): void => {
    if (m.ticket !== undefined) send({ acs: "release", ticket: m.ticket });
  };
  // The primary's shutdown instructions; before src/main.ts takes them, the last one is kept.
  let shutdownSaid: { signal: string; now: boolean } | undefined;
  let onShutdown: ShutdownHandlers | undefined;
  const shutdownFor = (handlers: ShutdownHandlers, said: { signal: string; now: boolean }): void => {
    handlers.drain(said.signal);
    if (said.now) handlers.now(said.signal);
  };
  // Until it listens, the worker tells the primary once a second that its event loop turns: the
  // primary replaces a starting worker silent for twice ACS_WORKER_TIMEOUT_MS too (a wait on the
  // store is not silence; a loop stalled is).
  send({ acs: "starting" });
  const starting = setInterval(() => send({ acs: "starting" }), STARTING_REPORT_MS);
  starting.unref();
  process.on("message", (m: unknown) => {
    if (!isAcsMessage(m)) return;
    const msg = m as ToWorker;
    if (msg.acs === "engine") engineAlive = msg.alive;
    else if (msg.acs === "shutdown") {
      shutdownSaid = { signal: msg.signal, now: msg.now || shutdownSaid?.now === true };
      if (onShutdown !== undefined) shutdownFor(onShutdown, shutdownSaid);
    } else if (msg.acs === "scrape") scrapes.get(msg.id)?.(msg);
    else if (msg.acs === "admit") admitAnswered(msg);
    else if (msg.acs === "metrics") {
      const id = msg.id;
      (registry?.getMetricsAsJSON() ?? Promise.resolve([])).then(
        (metrics) => send({ acs: "metrics", id, metrics }),
        (err: unknown) => {
          logger.error({ err }, "reading this worker's metrics failed");
          send({ acs: "metrics", id, metrics: [] });
        },
      );
    }
  });
  return {
    slot: settings.slot,
    instanceId: settings.instanceId,
    embeddedModel: settings.embeddedModel,
    engineAlive: () => engineAlive,
    registerMetrics(metrics) {
      registry = metrics.registry;
      const worker = String(settings.slot);
      new Counter({
        name: "acs_worker_requests_total",
        help: "Requests answered by each gateway worker process (ACS_WORKERS), by its slot 1..N.",
        labelNames: ["worker"],
        registers: [metrics.registry],
        async collect() {
          const { values } = await metrics.calls.requests.get();
          this.reset();
          this.inc(
            { worker },
            values.reduce((sum, v) => sum + v.value, 0),
          );
        },
      });
    },
    scrape() {
      const id = nextId++;
      return new Promise<string>((resolve, reject) => {
        // Not this worker's own metrics instead: its counters alone are lower than the sums the
        // scrapes before had (a counter reset to Prometheus). A failed scrape is only a gap.
        const fail = (why: string) => {
          scrapes.delete(id);
          logger.warn({ why }, "the workers' metrics are unavailable: /metrics answers 503");
          reject(
            new ApiError(
              "upstream_unavailable",
              `The gateway's metrics are unavailable: ${why}. Retry the scrape.`,
            ),
          );
        };
        const timer = setTimeout(() => fail("the cluster's primary did not answer within 10 s"), 10_000);
        scrapes.set(id, (reply) => {
          clearTimeout(timer);
          scrapes.delete(id);
          if (reply.text !== undefined) resolve(reply.text);
          else fail(`the cluster's primary failed to aggregate them (${reply.error ?? "no answer"})`);
        });
        if (!process.send?.({ acs: "scrape", id } satisfies ToPrimary)) {
          clearTimeout(timer);
          fail("this worker has no channel to the cluster's primary");
        }
      });
    },
    listening(info) {
      clearInterval(starting);
      send({ acs: "listening", info });
    },
    reportReadiness(read) {
      let last = "";
      let sentAt = 0;
      const check = () => {
        const readiness = read();
        const text = JSON.stringify(readiness);
        if (text === last && performance.now() - sentAt < 1000) return;
        last = text;
        sentAt = performance.now();
        send({ acs: "readiness", readiness });
      };
      check();
      setInterval(check, READINESS_CHECK_MS).unref();
    },
    admission(limits) {
      const { admission, answered } = workerAdmission(limits, logger, send, () => nextId++);
      admitAnswered = answered;
      return admission;
    },
    onShutdown(handlers) {
      onShutdown = handlers;
      if (shutdownSaid !== undefined) shutdownFor(handlers, shutdownSaid);
    },
  };
}

/** A request this worker holds a place for (its share of `inFlight`). */
interface HeldPlace {
  readonly keyId: string;
  readonly demand: AdmissionDemand;
  readonly upstreamRequests: number;
}

/**
 * {@link ClusterWorker.admission}: admits through the primary; alone while it does not answer.
 * `answered` takes the primary's answers to this worker's admits.
 */
function workerAdmission(
  limits: AdmissionLimits,
  logger: Logger,
  send: (m: ToPrimary) => void,
  newId: () => number,
): { admission: Admission; answered: (m: AdmitAnswer) => void } {
  const alone = createAdmission(limits);
  const held = new Set<HeldPlace>();
  const pending = new Map<number, (m: AdmitAnswer) => void>();
  /** The primary missed an answer: requests are counted alone until it answers again. */
  let quiet = false;
  const hold = (keyId: string, demand: AdmissionDemand, ticket: AdmissionTicket): AdmissionTicket => {
    const place: HeldPlace = { keyId, demand, upstreamRequests: ticket.upstreamRequests };
    held.add(place);
    return {
      upstreamRequests: ticket.upstreamRequests,
      release() {
        if (!held.delete(place)) return;
        ticket.release();
      },
    };
  };
  const countAlone = (keyId: string, demand: AdmissionDemand): AdmissionTicket =>
    hold(keyId, demand, alone.admit(keyId, demand));
  const goQuiet = (why: string): void => {
    if (quiet) return;
    quiet = true;
    logger.warn({ why }, "the primary does not count the requests' places; this worker counts its own");
  };
  const answered = (m: AdmitAnswer): void => {
    if (quiet) {
      quiet = false;
      logger.info("the primary counts the requests' places again");
    }
    const answer = pending.get(m.id);
    if (answer !== undefined) answer(m);
    // Not waited for (counted alone meanwhile): the primary's place goes back at once.
    else if (m.ticket !== undefined) send({ acs: "release", ticket: m.ticket });
  };
  const admission: Admission = {
    limits,
    get activeKeys() {
      return new Set([...held].map((p) => p.keyId)).size;
    },
    inFlight(keyId): KeyInFlight {
      const byModel = new Map<string, number>();
      let requests = 0;
      let streams = 0;
      for (const p of held) {
        if (p.keyId !== keyId) continue;
        requests++;
        if (p.demand.stream) streams++;
        byModel.set(p.demand.modelId, (byModel.get(p.demand.modelId) ?? 0) + p.upstreamRequests);
      }
      return { requests, streams, byModel };
    },
    admit(keyId, demand) {
      const id = newId();
      if (!process.connected) {
        goQuiet("no channel to the primary");
        return countAlone(keyId, demand);
      }
      // `send` returning false only says its queue is long: the message still goes.
      send({ acs: "admit", id, keyId, demand });
      // Asked all the same (its answer says the primary is back), but not waited for.
      if (quiet) return countAlone(keyId, demand);
      return new Promise<AdmissionTicket>((resolve, reject) => {
        // Counted here alone; a cap this worker's own counts break refuses it.
        const resolveAlone = (): void => {
          try {
            resolve(countAlone(keyId, demand));
          } catch (err) {
            reject(err);
          }
        };
        const timer = setTimeout(() => {
          // After this turn's poll phase: an answer already in the pipe (this worker's event loop
          // was busy past the wait, as under a burst) is read first, and settles the admit.
          setImmediate(() => {
            if (!pending.delete(id)) return;
            goQuiet(`no answer in ${ADMIT_ANSWER_MS} ms`);
            resolveAlone();
          });
        }, ADMIT_ANSWER_MS);
        pending.set(id, (answer) => {
          clearTimeout(timer);
          pending.delete(id);
          if (answer.refused !== undefined) {
            reject(rateLimited(answer.refused));
          } else if (answer.ticket === undefined) {
            // The primary failed to count it (logged there): counted here alone.
            resolveAlone();
          } else {
            const ticket = answer.ticket;
            const counted: AdmissionTicket = {
              upstreamRequests: answer.upstreamRequests ?? 1,
              release: () => void send({ acs: "release", ticket }),
            };
            resolve(hold(keyId, demand, counted));
          }
        });
      });
    },
  };
  return { admission, answered };
}

/** The embedded engine as the primary runs it (src/main.ts `startEmbeddedEngine`). */
export interface PrimaryEngine {
  readonly model: ModelConfig;
  isAlive(): boolean;
  stop(): Promise<void>;
}

/** Options of {@link runPrimary}. */
export interface PrimaryOptions {
  readonly config: Config;
  /** Worker processes (≥ 2). */
  readonly workers: number;
  readonly logger: Logger;
  /** The embedded engine, already started; stopped after the last worker exits. */
  readonly engine?: PrimaryEngine | undefined;
  /** A worker that lived less than this and died is restarted after a growing delay, ms. @default 5000 */
  readonly minUptimeMs?: number;
  /** After SIGTERM, workers still running after this long are SIGKILLed, ms. @default 60000 */
  readonly forceAfterMs?: number;
}

/** Exit code of an operator's mistake, as src/main.ts uses it (a worker reports it first). */
const USAGE_EXIT = 2;

interface Slot {
  readonly n: number;
  worker: Worker | undefined;
  listening: boolean;
  startedAt: number;
  delayMs: number;
  /** The places the primary counts for the requests of this slot's worker, by ticket. */
  readonly places: Map<number, AdmissionTicket>;
  /** What its worker last reported of its readiness; undefined until then. */
  readiness: Readiness | undefined;
  /**
   * When its worker was last heard from (forked, "starting", "listening", a readiness report):
   * performance.now(), which no wall-clock step moves.
   */
  heardAt: number;
  /** Killed for its silence (ACS_WORKER_TIMEOUT_MS); its 'exit' has not come yet. */
  timedOut: boolean;
  /**
   * Its worker has reported (a "starting" report, or "listening"). Before that, its silence since
   * its fork is allowed four times ACS_WORKER_TIMEOUT_MS: Node's own start, with no event loop
   * turning yet to report, takes ~0.4 s to the first report, and 10 s and more on a starved CPU.
   */
  reported: boolean;
}

/**
 * The primary of ACS_WORKERS > 1 (never returns: the process exits after the workers do).
 * Start: releases the Holds an earlier run left in a SQLite file (without ACS_INSTANCE_ID, as the
 * single process does), forks worker 1, waits until it listens (exit code 2 with its one line if
 * it cannot — a port in use), then the others, all accepting on one shared socket (SCHED_NONE);
 * logs `acs-gateway listening on URL …` once all listen. A worker that dies is logged and started
 * again in its slot (same instance id, so it releases the Holds its predecessor left), after 0.1 s,
 * doubling up to 10 s while workers die young or before they listen. A worker, listening or still
 * starting, not heard from for `config.workerTimeoutMs` (ACS_WORKER_TIMEOUT_MS; its event loop
 * stalled; starting: twice that since its last report, four times since its fork before its
 * first) is SIGKILLed and so started again (`acs_cluster_worker_timeouts_total`; worker 1 at the
 * start: the start fails), listening ones one at a time (the last one holding the port waits for
 * another's replacement to listen), and while closing too (not started again then); the time
 * the primary's own loop was held up is not counted (its reports waited unread). SIGTERM or
 * SIGINT: SIGTERM to every worker (each closes as the single process does), then the engine is stopped and the primary exits 0 (1 if a
 * worker did not end cleanly).
 */
export async function runPrimary(options: PrimaryOptions): Promise<never> {
  const { config, logger, engine } = options;
  // One listening socket, bound by the primary, shared: every worker accepts on it (nginx's default
  // design). Not node:cluster's round robin (the primary accepting each connection and handing it
  // to a worker over IPC): a connection handed to a worker that is SIGKILLed before it took it is
  // never closed, its caller waits for good (one per kill, measured). Not a socket per worker
  // (SO_REUSEPORT): any process of the same user could bind the port too and take a share of its
  // connections, and a worker whose event loop stalls keeps getting its share, queued unanswered.
  // Shared, a dead or stalled worker takes only the connections it had accepted; the queue stays
  // for the others.
  cluster.schedulingPolicy = cluster.SCHED_NONE;
  const minUptimeMs = options.minUptimeMs ?? 5000;
  const base = config.instanceId ?? `${hostname()}:${process.pid}:${Math.random().toString(16).slice(2, 10)}`;
  if (config.db?.kind === "sqlite" && config.instanceId === undefined) {
    const { createBudgetLedger } = await import("../budget/index.js");
    try {
      const ledger = await createBudgetLedger({ path: config.db.path, reclaimIntervalMs: 0 });
      try {
        const reclaimed = await ledger.reclaimOnStart("all");
        logger.info({ db: config.db.path, reclaimed }, "released the Holds an earlier run left");
      } finally {
        await ledger.close();
      }
    } catch (err) {
      // Not a database, cannot be opened: one line for the operator (src/main.ts prints it).
      throw dbOpenError(err, config.db) ?? err;
    }
  }

  const slots: Slot[] = Array.from({ length: options.workers }, (_, i) => ({
    n: i + 1,
    worker: undefined,
    listening: false,
    startedAt: 0,
    delayMs: 100,
    places: new Map(),
    readiness: undefined,
    heardAt: 0,
    timedOut: false,
    reported: false,
  }));
  // The per-key caps of every worker (see ClusterWorker.admission).
  const admission = createAdmission(admissionLimitsFrom(config));
  let nextTicket = 0;
  let closing = false;
  let unclean = false;
  let restarts = 0;
  let timeouts = 0;
  let first: ListeningInfo | undefined;
  let announced = false;
  /** Scrapes waiting for workers' answers: the answers by slot, the slots still waiting. */
  const pendingScrapes = new Map<
    number,
    { got: Map<number, MetricsJson>; waiting: Set<number>; silent: Set<number>; done: () => void }
  >();
  let nextScrape = 0;
  const workerMetrics = new WorkerMetricsMemory();

  const primaryRegistry = new Registry();
  new Gauge({
    name: "acs_cluster_workers",
    help: "Gateway worker processes listening now (ACS_WORKERS).",
    registers: [primaryRegistry],
    collect() {
      this.set(slots.filter((s) => s.listening).length);
    },
  });
  new Counter({
    name: "acs_cluster_worker_restarts_total",
    help: "Gateway worker processes started again after one died.",
    registers: [primaryRegistry],
    collect() {
      this.reset();
      this.inc(restarts);
    },
  });

  new Counter({
    name: "acs_cluster_worker_timeouts_total",
    help: "Gateway worker processes killed after ACS_WORKER_TIMEOUT_MS without a report (their event loops stalled).",
    registers: [primaryRegistry],
    collect() {
      this.reset();
      this.inc(timeouts);
    },
  });

  /**
   * Every listening worker's metrics, aggregated, plus the primary's own; the counters and
   * histograms of workers that did not answer in time or have exited as they last answered
   * (WorkerMetricsMemory: no counter of the aggregate goes back).
   */
  const aggregate = (): Promise<string> =>
    new Promise((resolve, reject) => {
      const id = nextScrape++;
      const live = slots.filter((s) => s.listening && s.worker?.isConnected());
      const entry = {
        got: new Map<number, MetricsJson>(),
        waiting: new Set(live.map((s) => s.n)),
        // Read as they last answered: a worker whose channel closed before its 'exit' came, and
        // one that answered nothing (it failed to read its registry).
        silent: new Set(slots.filter((s) => s.listening && !s.worker?.isConnected()).map((s) => s.n)),
        done: () => {
          clearTimeout(timer);
          pendingScrapes.delete(id);
          const parts = workerMetrics.forScrape(entry.got.values(), [...entry.waiting, ...entry.silent]);
          Promise.all([AggregatorRegistry.aggregate(parts).metrics(), primaryRegistry.metrics()]).then(
            ([workers, own]) => resolve(`${workers}${own}`),
            reject,
          );
        },
      };
      // A worker that does not answer within 5 s (stuck, or closing) is read as it last answered.
      const timer = setTimeout(() => {
        logger.warn({ workers: [...entry.waiting] }, "workers did not answer a metrics scrape in 5 s");
        entry.done();
      }, 5000);
      pendingScrapes.set(id, entry);
      for (const s of live) s.worker?.send({ acs: "metrics", id } satisfies ToWorker);
      if (entry.waiting.size === 0) entry.done();
    });

  /** One request's place for `slot`'s worker: a ticket, or the refusal's message. */
  const admitFor = (
    slot: Slot,
    keyId: string,
    demand: AdmissionDemand,
  ): { ticket?: number; upstreamRequests?: number; refused?: string } => {
    try {
      const place = admission.admit(keyId, demand);
      const ticket = nextTicket++;
      slot.places.set(ticket, place);
      return { ticket, upstreamRequests: place.upstreamRequests };
    } catch (err) {
      if (err instanceof ApiError && err.code === "rate_limited") return { refused: err.message };
      // A bug: the worker counts the request alone rather than the primary failing.
      logger.error({ err, worker: slot.n }, "counting a request's place failed");
      return {};
    }
  };

  const onMessage = (slot: Slot, worker: Worker, m: unknown) => {
    if (!isAcsMessage(m)) return;
    const msg = m as ToPrimary;
    if (msg.acs === "listening") {
      // A dead worker's late message (its 'exit' can come first) is not its slot's.
      if (slot.worker !== worker) return;
      slot.listening = true;
      slot.reported = true;
      slot.heardAt = performance.now();
      // (Its restart delay stays: it goes back to 0.1 s once a worker has lived minUptimeMs.)
      first ??= msg.info;
      logger.debug({ worker: slot.n, workerPid: slot.worker?.process.pid }, "worker listening");
      if (!announced && slots.every((s) => s.listening)) {
        announced = true;
        logger.info(
          { url: first.url, port: first.port, workers: slots.length, models: first.models },
          `acs-gateway listening on ${first.url} (REST, Connect, gRPC-Web, gRPC)`,
        );
      }
    } else if (msg.acs === "metrics") {
      // A dead worker's late answer (its 'exit' can come first) is not its slot's.
      if (slot.worker !== worker) return;
      // Also a late answer, after its scrape went on without it: the newest this worker counted.
      workerMetrics.answered(slot.n, msg.id, msg.metrics);
      const entry = pendingScrapes.get(msg.id);
      if (entry === undefined || !entry.waiting.delete(slot.n)) return;
      if (msg.metrics.length > 0) entry.got.set(slot.n, msg.metrics);
      else entry.silent.add(slot.n);
      if (entry.waiting.size === 0) entry.done();
    } else if (msg.acs === "admit") {
      // A worker that has exited (its 'exit' can come before the last messages it wrote) or whose
      // channel is gone holds no place: none is counted for it (onExit has released its slot's).
      if (slot.worker !== worker || !worker.isConnected()) return;
      const answer = admitFor(slot, msg.keyId, msg.demand);
      // The worker may have died since it wrote the admit: the write then fails (EPIPE), and the
      // place goes back rather than the failure being thrown in the primary.
      worker.send({ ...answer, acs: "admit", id: msg.id } satisfies ToWorker, undefined, undefined, (err) => {
        if (err === null || answer.ticket === undefined) return;
        slot.places.get(answer.ticket)?.release();
        slot.places.delete(answer.ticket);
      });
    } else if (msg.acs === "starting") {
      if (slot.worker !== worker) return;
      if (!slot.reported) logger.debug({ worker: slot.n, workerPid: worker.process.pid }, "worker starting");
      slot.reported = true;
      slot.heardAt = performance.now();
    } else if (msg.acs === "readiness") {
      if (slot.worker === worker) {
        slot.readiness = msg.readiness;
        slot.heardAt = performance.now();
      }
    } else if (msg.acs === "release") {
      slot.places.get(msg.ticket)?.release();
      slot.places.delete(msg.ticket);
    } else if (msg.acs === "scrape") {
      const id = msg.id;
      aggregate().then(
        (text) => slot.worker?.send({ acs: "scrape", id, text } satisfies ToWorker),
        (err: unknown) => slot.worker?.send({ acs: "scrape", id, error: String(err) } satisfies ToWorker),
      );
    }
  };

  const fork = (slot: Slot): Worker => {
    const settings: WorkerSettings = {
      slot: slot.n,
      instanceId: `${base}/w${slot.n}`,
      embeddedModel: engine?.model,
      engineAlive: engine?.isAlive() ?? true,
    };
    // UV_TCP_SINGLE_ACCEPT: libuv yields after each connection it accepts on the shared socket,
    // so that a burst is spread over the workers rather than taken whole by the first awake.
    const worker = cluster.fork({ [WORKER_ENV]: JSON.stringify(settings), UV_TCP_SINGLE_ACCEPT: "1" });
    slot.worker = worker;
    slot.listening = false;
    slot.timedOut = false;
    slot.startedAt = Date.now();
    slot.reported = false;
    slot.heardAt = performance.now();
    worker.on("message", (m: unknown) => onMessage(slot, worker, m));
    // A send to a worker that just died fails with EPIPE, emitted as 'error' on the Worker: without
    // a listener that would throw in the primary and end the gateway. Its 'exit' follows.
    worker.on("error", (err: unknown) =>
      logger.warn({ err, worker: slot.n }, "a message to a worker failed"),
    );
    worker.once("exit", (code, signal) => onExit(slot, worker, code, signal));
    return worker;
  };

  let startFailed: ((code: number) => void) | undefined;
  const onExit = (slot: Slot, worker: Worker, code: number | null, signal: string | null) => {
    const wasListening = slot.listening;
    slot.listening = false;
    slot.readiness = undefined;
    if (slot.worker === worker) slot.worker = undefined;
    // Its requests ended with it: their places go back.
    for (const place of slot.places.values()) place.release();
    slot.places.clear();
    // Its last answer is kept for the scrapes to come; a scrape still waiting drops the answer it
    // got from it, which that memory now counts (else twice).
    workerMetrics.workerExited(slot.n);
    for (const entry of pendingScrapes.values()) {
      entry.got.delete(slot.n);
      if (entry.waiting.delete(slot.n) && entry.waiting.size === 0) entry.done();
    }
    if (closing) {
      // A worker still starting has no handler yet: SIGTERM (or the process group's SIGINT) ends
      // it at once, which is clean.
      const killedStarting = !wasListening && (signal === "SIGTERM" || signal === "SIGINT");
      if (code !== 0 && !killedStarting) unclean = true;
      logger.info({ worker: slot.n, workerPid: worker.process.pid, code, signal }, "worker exited");
      return;
    }
    if (!wasListening && startFailed !== undefined) {
      // Before the gateway listened: the worker has said why (a port in use is exit code 2).
      startFailed(code ?? 1);
      return;
    }
    // A worker that died young, or before it listened, is started again after a delay that doubles
    // (a store that refuses it, a CPU too starved to start it: not all of them at once, in a loop).
    const livedMs = Date.now() - slot.startedAt;
    const young = !wasListening || livedMs < minUptimeMs;
    const delay = young ? slot.delayMs : 100;
    slot.delayMs = young ? Math.min(slot.delayMs * 2, 10_000) : 100;
    restarts++;
    logger.error(
      {
        worker: slot.n,
        workerPid: worker.process.pid,
        code,
        signal,
        livedMs,
        listened: wasListening,
        restartInMs: delay,
      },
      "worker exited; starting another in its place",
    );
    // Not unref()ed: with every worker dead (and no engine child) it is what keeps the primary
    // alive to start them again.
    setTimeout(() => {
      if (!closing) fork(slot);
    }, delay);
  };

  const exitAll = async (code: number): Promise<never> => {
    closing = true;
    for (const s of slots) s.worker?.process.kill("SIGKILL");
    await engine?.stop();
    process.exit(code);
  };

  // The engine's liveness reaches every worker's readiness.
  let engineWas = true;
  if (engine !== undefined) {
    setInterval(() => {
      const alive = engine.isAlive();
      if (alive === engineWas) return;
      engineWas = alive;
      for (const s of slots) s.worker?.send({ acs: "engine", alive } satisfies ToWorker);
    }, 500).unref();
  }

  // A listening worker is told to drain rather than sent a signal: the signal the process group
  // got reached it too, and the primary's copy would count as a second one. A worker still
  // starting has no handler yet: SIGTERM ends it at once.
  const tell = (slot: Slot, signal: string, now: boolean): void => {
    const w = slot.worker;
    if (w === undefined) return;
    if (!slot.listening || !w.isConnected()) {
      if (!now) w.process.kill("SIGTERM");
      return;
    }
    w.send({ acs: "shutdown", signal, now } satisfies ToWorker, undefined, undefined, (err) => {
      if (err !== null && !now) w.process.kill("SIGTERM");
    });
  };

  const shutdown = (signal: string) => {
    if (closing) return;
    closing = true;
    logger.info({ signal, workers: slots.length }, "shutting down: every worker closes");
    const live = slots.flatMap((s) => (s.worker === undefined ? [] : [s.worker]));
    const force = setTimeout(() => {
      const left = slots.flatMap((s) => (s.worker === undefined ? [] : [s.worker.process.pid]));
      logger.error({ workerPids: left }, "workers still running after the shutdown's time; killing them");
      for (const w of live) w.process.kill("SIGKILL");
    }, options.forceAfterMs ?? 60_000);
    force.unref();
    for (const s of slots) tell(s, signal, false);
    Promise.all(
      live.map((w) =>
        w.isDead() ? undefined : new Promise<void>((resolve) => w.once("exit", () => resolve())),
      ),
    )
      .then(() => engine?.stop())
      .then(
        () => process.exit(unclean ? 1 : 0),
        (err: unknown) => {
          logger.error({ err }, "stopping the engine failed");
          process.exit(1);
        },
      );
  };
  // The first signal drains; its copies (the process group's and a parent's, npm's) count once; a
  // later one has every worker end its calls in flight now.
  onShutdownSignals(logger, {
    drain: shutdown,
    now(signal) {
      logger.info({ signal }, "second signal: every worker ends the calls in flight now");
      for (const s of slots) tell(s, signal, true);
    },
  });

  // ACS_WORKER_TIMEOUT_MS: a worker silent that long, listening or still starting, is killed; its
  // 'exit' starts another (or, for worker 1 at the gateway's start, ends the start with exit 1).
  if (config.workerTimeoutMs > 0) {
    const timeoutMs = config.workerTimeoutMs;
    let tickedAt = performance.now();
    setInterval(() => {
      const now = performance.now();
      // This loop itself was held up (the primary stopped or busy): the workers' reports waited
      // unread in its channels meanwhile, so that time is not counted as their silence. Only
      // that time: a worker stuck before it is still counted silent for what came before.
      const lateMs = now - tickedAt - WATCHDOG_TICK_MS;
      tickedAt = now;
      for (const slot of slots) {
        if (lateMs > WATCHDOG_TICK_MS) slot.heardAt += lateMs;
        const worker = slot.worker;
        if (worker === undefined || slot.timedOut) continue;
        // Silent since its last report, or since its fork before its first. A worker still
        // starting gets twice the time (its modules are evaluated in long synchronous steps,
        // which a starved CPU stretches to seconds), one that has not reported yet four times
        // (Node's own start, 0.4 s alone, 10 s and more on a starved CPU).
        const silentMs = now - slot.heardAt;
        const limitMs = slot.listening
          ? timeoutMs
          : (slot.reported ? STARTING_TIMEOUT_FACTOR : FIRST_REPORT_TIMEOUT_FACTOR) * timeoutMs;
        if (silentMs < limitMs) continue;
        // One at a time: the shared listening socket closes once no worker holds it (node:cluster),
        // resetting the connections waiting in its queue; a stalled worker still holds it. So the
        // last worker standing waits for another's replacement to listen. (Closing: none comes.)
        // A worker still starting holds no connection.
        const another = slots.some((o) => o !== slot && o.listening && !o.timedOut);
        if (slot.listening && !closing && !another) continue;
        slot.timedOut = true;
        timeouts++;
        const what = slot.listening
          ? "worker not heard from within ACS_WORKER_TIMEOUT_MS (its event loop stalled)"
          : slot.reported
            ? "worker not heard from within twice ACS_WORKER_TIMEOUT_MS while starting (its event loop stalled)"
            : "worker sent no report within four times ACS_WORKER_TIMEOUT_MS of its fork (stuck before the gateway's code ran)";
        const then = closing
          ? "killing it"
          : !slot.listening && startFailed !== undefined
            ? "killing it: the gateway's start fails"
            : "killing it and starting another in its place";
        logger.error(
          {
            worker: slot.n,
            workerPid: worker.process.pid,
            silentMs: Math.round(silentMs),
            limitMs,
            timeoutMs,
          },
          `${what}${closing && slot.listening ? " while the gateway closes" : ""}; ${then}`,
        );
        worker.process.kill("SIGKILL");
      }
    }, WATCHDOG_TICK_MS).unref();
  }

  // The ops port (ACS_OPS_PORT), answered here: this event loop does none of the requests' work.
  // Live and ready count the listening workers heard from lately (a stalled one is neither).
  const heard = () => slots.filter((s) => s.listening && performance.now() - s.heardAt < WORKER_SILENT_MS);
  if (config.opsPort !== undefined) {
    try {
      const ops = await listenOps(
        {
          live: () => heard().length > 0,
          // Closing: not ready at once, whatever a stalled worker last said.
          readiness: () => {
            const r = clusterReadiness(heard());
            if (!closing) return r;
            const reasons = r.ready ? [] : (r.reasons ?? []);
            const draining = "draining: the gateway is shutting down";
            return {
              ...r,
              ready: false,
              reasons: reasons.includes(draining) ? reasons : [draining, ...reasons],
            };
          },
          metrics: async () => ({ contentType: primaryRegistry.contentType, text: await aggregate() }),
        },
        { host: config.host, port: config.opsPort, logger },
      );
      logger.info({ url: ops.url, port: ops.port }, `ops routes (/healthz, /readyz, /metrics) on ${ops.url}`);
    } catch (err) {
      process.stderr.write(`acs-gateway: ${opsListenRefusal(err, config.opsPort, config.host)}\n`);
      return exitAll(USAGE_EXIT);
    }
  }

  // Worker 1 alone first: if it cannot listen, it says why once and the gateway exits.
  const started = (slot: Slot) =>
    new Promise<number | undefined>((resolve) => {
      startFailed = resolve;
      const w = fork(slot);
      const check = (m: unknown) => {
        if (isAcsMessage(m) && m.acs === "listening") {
          w.off("message", check);
          resolve(undefined);
        }
      };
      w.on("message", check);
    });
  const [one, ...rest] = slots as [Slot, ...Slot[]];
  const failed = await started(one);
  if (failed !== undefined) return exitAll(failed === USAGE_EXIT ? USAGE_EXIT : 1);
  startFailed = undefined;
  for (const s of rest) fork(s);
  // Never resolves: the process ends in shutdown() or exitAll().
  return new Promise<never>(() => undefined);
}

/**
 * The cluster's readiness from its live workers' reports: ready when one of them is (it takes
 * requests on the shared port); a model serves when it serves on one of them (as a single
 * process's /readyz lists its models, ready or not).
 */
function clusterReadiness(live: readonly Slot[]): Readiness {
  const models: Record<string, "serving" | "not_serving"> = {};
  const reasons = new Set<string>();
  let ready = false;
  for (const { readiness } of live) {
    if (readiness === undefined) continue;
    ready ||= readiness.ready;
    for (const reason of readiness.reasons ?? []) reasons.add(reason);
    for (const [id, state] of Object.entries(readiness.models))
      if (models[id] !== "serving") models[id] = state;
  }
  if (ready) return { ready, models };
  if (reasons.size === 0)
    reasons.add(
      live.length === 0
        ? "no worker has reported recently (stalled, or not started yet)"
        : "no worker is ready",
    );
  return { ready, models, reasons: [...reasons] };
}
