// The cluster's primary (ACS_WORKERS = N > 1): N gateway processes on one port (node:cluster). It
// starts the workers (the first alone, so that a port in use is one line and exit code 2),
// restarts a worker that dies (watchdog.ts: or whose event loop stalled), counts the per-key caps
// for all of them (admission-broker.ts), answers the ops port (primary-ops.ts) and /metrics
// (metrics.ts), and shuts them down on SIGTERM/SIGINT (shutdown.ts).
import cluster, { type Worker } from "node:cluster";
import { hostname } from "node:os";
import type { Logger } from "pino";
import { Registry } from "prom-client";
import { type Config, dbOpenError } from "../../config/index.js";
import { admissionLimitsFrom, createAdmission } from "../../service/admission.js";
import { USAGE_EXIT } from "../operator-lines.js";
import { WorkerMetricsMemory } from "../worker-metrics.js";
import { brokerAdmit, releasePlace, releaseSlotPlaces } from "./admission-broker.js";
import {
  isAcsMessage,
  type ListeningInfo,
  type ToPrimary,
  type ToWorker,
  WORKER_ENV,
  type WorkerSettings,
} from "./ipc.js";
import { answerScrape, metricsAnswered, metricsWorkerExited, registerClusterMetrics } from "./metrics.js";
import { servePrimaryOps } from "./primary-ops.js";
import { emptySlot, type Primary, type PrimaryOptions, type Slot } from "./primary-state.js";
import { exitAll, shutDownOnSignals } from "./shutdown.js";
import { startWatchdog } from "./watchdog.js";

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
 * SIGINT: SIGTERM to every worker (each closes as the single process does), then the engine is
 * stopped and the primary exits 0 (1 if a worker did not end cleanly).
 */
export async function runPrimary(options: PrimaryOptions): Promise<never> {
  const { config, logger } = options;
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
  await reclaimEarlierHolds(config, logger);
  const primary = createPrimary(options, base, minUptimeMs);
  registerClusterMetrics(primary);
  tellEngineLiveness(primary);
  shutDownOnSignals(primary);
  startWatchdog(primary);
  if (!(await servePrimaryOps(primary))) return exitAll(primary, USAGE_EXIT);
  // Worker 1 alone first: if it cannot listen, it says why once and the gateway exits.
  const [one, ...rest] = primary.slots as [Slot, ...Slot[]];
  const failed = await started(primary, one);
  if (failed !== undefined) return exitAll(primary, failed === USAGE_EXIT ? USAGE_EXIT : 1);
  primary.startFailed = undefined;
  for (const s of rest) fork(primary, s);
  // Never resolves: the process ends in shutdown() or exitAll().
  return new Promise<never>(() => undefined);
}

/**
 * SQLite without ACS_INSTANCE_ID: releases every Hold an earlier run left, as the single process
 * does (the workers, with instance ids of their own, do not). A file that cannot be opened is a
 * ConfigError (src/config/db-open-error.ts), which src/main.ts prints.
 */
async function reclaimEarlierHolds(config: Config, logger: Logger): Promise<void> {
  if (config.db?.kind !== "sqlite" || config.instanceId !== undefined) return;
  const { createBudgetLedger } = await import("../../budget/index.js");
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

function createPrimary(options: PrimaryOptions, base: string, minUptimeMs: number): Primary {
  const { config, logger, engine } = options;
  return {
    options,
    config,
    logger,
    engine,
    base,
    minUptimeMs,
    slots: Array.from({ length: options.workers }, (_, i) => emptySlot(i + 1)),
    // The per-key caps of every worker (see ClusterWorker.admission).
    admission: createAdmission(admissionLimitsFrom(config)),
    nextTicket: 0,
    closing: false,
    unclean: false,
    restarts: 0,
    timeouts: 0,
    first: undefined,
    announced: false,
    startFailed: undefined,
    scrapes: {
      registry: new Registry(),
      pending: new Map(),
      nextScrape: 0,
      memory: new WorkerMetricsMemory(),
    },
  };
}

/** The engine's liveness reaches every worker's readiness (checked every 0.5 s). */
function tellEngineLiveness(primary: Primary): void {
  const { engine } = primary;
  if (engine === undefined) return;
  let engineWas = true;
  setInterval(() => {
    const alive = engine.isAlive();
    if (alive === engineWas) return;
    engineWas = alive;
    for (const s of primary.slots) s.worker?.send({ acs: "engine", alive } satisfies ToWorker);
  }, 500).unref();
}

/** Forks `slot`'s first worker alone: resolves once it listens, or with its exit code. */
function started(primary: Primary, slot: Slot): Promise<number | undefined> {
  return new Promise<number | undefined>((resolve) => {
    primary.startFailed = resolve;
    const w = fork(primary, slot);
    const check = (m: unknown) => {
      if (isAcsMessage(m) && m.acs === "listening") {
        w.off("message", check);
        resolve(undefined);
      }
    };
    w.on("message", check);
  });
}

/** Forks a worker into `slot`, with its settings (instance id `<base>/w<slot>`). */
function fork(primary: Primary, slot: Slot): Worker {
  const { engine, logger } = primary;
  const settings: WorkerSettings = {
    slot: slot.n,
    instanceId: `${primary.base}/w${slot.n}`,
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
  worker.on("message", (m: unknown) => onMessage(primary, slot, worker, m));
  // A send to a worker that just died fails with EPIPE, emitted as 'error' on the Worker: without
  // a listener that would throw in the primary and end the gateway. Its 'exit' follows.
  worker.on("error", (err: unknown) => logger.warn({ err, worker: slot.n }, "a message to a worker failed"));
  worker.once("exit", (code, signal) => onExit(primary, slot, worker, code, signal));
  return worker;
}

/** One message of `worker`'s (in `slot`; a dead worker's late message is not its slot's). */
function onMessage(primary: Primary, slot: Slot, worker: Worker, m: unknown): void {
  if (!isAcsMessage(m)) return;
  const msg = m as ToPrimary;
  if (msg.acs === "listening") {
    // A dead worker's late message (its 'exit' can come first) is not its slot's.
    if (slot.worker !== worker) return;
    workerListening(primary, slot, msg.info);
  } else if (msg.acs === "metrics") {
    // A dead worker's late answer (its 'exit' can come first) is not its slot's.
    if (slot.worker !== worker) return;
    metricsAnswered(primary, slot, msg.id, msg.metrics);
  } else if (msg.acs === "admit") {
    brokerAdmit(primary, slot, worker, msg);
  } else if (msg.acs === "starting") {
    if (slot.worker !== worker) return;
    if (!slot.reported)
      primary.logger.debug({ worker: slot.n, workerPid: worker.process.pid }, "worker starting");
    slot.reported = true;
    slot.heardAt = performance.now();
  } else if (msg.acs === "readiness") {
    if (slot.worker === worker) {
      slot.readiness = msg.readiness;
      slot.heardAt = performance.now();
    }
  } else if (msg.acs === "release") {
    releasePlace(slot, msg.ticket);
  } else if (msg.acs === "scrape") {
    answerScrape(primary, slot, msg.id);
  }
}

/** `slot`'s worker listens; once all do, the one "listening" line. */
function workerListening(primary: Primary, slot: Slot, info: ListeningInfo): void {
  const { slots, logger } = primary;
  slot.listening = true;
  slot.reported = true;
  slot.heardAt = performance.now();
  // (Its restart delay stays: it goes back to 0.1 s once a worker has lived minUptimeMs.)
  primary.first ??= info;
  const first: ListeningInfo = primary.first;
  logger.debug({ worker: slot.n, workerPid: slot.worker?.process.pid }, "worker listening");
  if (!primary.announced && slots.every((s) => s.listening)) {
    primary.announced = true;
    logger.info(
      { url: first.url, port: first.port, workers: slots.length, models: first.models },
      `acs-gateway listening on ${first.url} (REST, Connect, gRPC-Web, gRPC)`,
    );
  }
}

/**
 * `slot`'s worker exited: its places go back, its metrics are kept as last answered; closing, it
 * is logged; at the start, the start fails; else another is forked after the slot's delay.
 */
function onExit(
  primary: Primary,
  slot: Slot,
  worker: Worker,
  code: number | null,
  signal: string | null,
): void {
  const wasListening = slot.listening;
  slot.listening = false;
  slot.readiness = undefined;
  if (slot.worker === worker) slot.worker = undefined;
  // Its requests ended with it: their places go back.
  releaseSlotPlaces(slot);
  metricsWorkerExited(primary, slot);
  if (primary.closing) {
    // A worker still starting has no handler yet: SIGTERM (or the process group's SIGINT) ends
    // it at once, which is clean.
    const killedStarting = !wasListening && (signal === "SIGTERM" || signal === "SIGINT");
    if (code !== 0 && !killedStarting) primary.unclean = true;
    primary.logger.info({ worker: slot.n, workerPid: worker.process.pid, code, signal }, "worker exited");
    return;
  }
  if (!wasListening && primary.startFailed !== undefined) {
    // Before the gateway listened: the worker has said why (a port in use is exit code 2).
    primary.startFailed(code ?? 1);
    return;
  }
  restartLater(primary, slot, worker, { code, signal, wasListening });
}

/**
 * A worker that died young, or before it listened, is started again after a delay that doubles
 * (a store that refuses it, a CPU too starved to start it: not all of them at once, in a loop).
 */
function restartLater(
  primary: Primary,
  slot: Slot,
  worker: Worker,
  exit: { code: number | null; signal: string | null; wasListening: boolean },
): void {
  const livedMs = Date.now() - slot.startedAt;
  const young = !exit.wasListening || livedMs < primary.minUptimeMs;
  const delay = young ? slot.delayMs : 100;
  slot.delayMs = young ? Math.min(slot.delayMs * 2, 10_000) : 100;
  primary.restarts++;
  primary.logger.error(
    {
      worker: slot.n,
      workerPid: worker.process.pid,
      code: exit.code,
      signal: exit.signal,
      livedMs,
      listened: exit.wasListening,
      restartInMs: delay,
    },
    "worker exited; starting another in its place",
  );
  // Not unref()ed: with every worker dead (and no engine child) it is what keeps the primary
  // alive to start them again.
  setTimeout(() => {
    if (!primary.closing) fork(primary, slot);
  }, delay);
}
