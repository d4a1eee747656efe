// A cluster worker's side (ACS_WORKERS > 1): what src/app/gateway-process.ts changes when this
// process is one of the workers. The worker reports to the primary (starting, listening, its
// readiness), answers its metrics reads, asks it for each keyed request's place
// (worker-admission.ts), reads /metrics through it, and takes its shutdown instructions.
import cluster from "node:cluster";
import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import type { ModelConfig } from "../../config/index.js";
import { ApiError } from "../../core/errors/index.js";
import type { Admission, AdmissionLimits } from "../../service/admission.js";
import type { GatewayMetrics } from "../../surfaces/http/metrics.js";
import type { Readiness } from "../../surfaces/http/ops-server.js";
import type { ShutdownHandlers } from "../shutdown-signals.js";
import {
  type AdmitAnswer,
  isAcsMessage,
  type ListeningInfo,
  sendToPrimary as send,
  type ToPrimary,
  type ToWorker,
  WORKER_ENV,
  type WorkerSettings,
} from "./ipc.js";
import { workerAdmission } from "./worker-admission.js";

/** A cluster worker's side: what src/app/gateway-process.ts changes when it runs as one of ACS_WORKERS. */
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
   * (src/app/cluster/primary-ops.ts `WORKER_SILENT_MS`), and kills a worker silent for
   * ACS_WORKER_TIMEOUT_MS.
   */
  reportReadiness(read: () => Readiness): void;
  /**
   * The per-key caps counted across every worker: each admit asks the primary (one IPC round
   * trip) and each release tells it. `limits` must be the primary's (both read the configuration).
   * `inFlight` and `activeKeys` are this worker's share. If the primary does not answer within
   * ADMIT_ANSWER_MS (src/app/cluster/worker-admission.ts), or the channel is gone, this worker
   * counts its requests alone, with a warning, until the primary answers again: a place it grants
   * meanwhile is given back at once.
   */
  admission(limits: AdmissionLimits): Admission;
  /**
   * The primary's shutdown instructions: `drain` on its first signal, `now` on a second one. The
   * worker's own SIGTERM/SIGINT (the same signal sent to the process group) is the same shutdown,
   * not a second one. An instruction that came before this call is passed on at once.
   */
  onShutdown(handlers: ShutdownHandlers): void;
}

/** How often a worker checks its readiness for the primary's ops port, ms. */
export const READINESS_CHECK_MS = 250;

/** How often a worker that does not listen yet tells the primary it is alive, ms. */
const STARTING_REPORT_MS = 1000;

/** How long a worker waits for the primary's aggregate of a /metrics scrape, ms. */
const SCRAPE_ANSWER_MS = 10_000;

/** A shutdown instruction of the primary. */
interface ShutdownSaid {
  readonly signal: string;
  readonly now: boolean;
}

/** The worker side's state: what the primary said, and who waits for its answers. */
interface WorkerSide {
  readonly settings: WorkerSettings;
  readonly logger: Logger;
  engineAlive: boolean;
  /** The registry the primary reads (registerMetrics); none before. */
  registry: Registry | undefined;
  /** The ids of scrapes and admits, one sequence. */
  nextId: number;
  /** The scrapes waiting for the primary's aggregate, by id. */
  readonly scrapes: Map<number, (m: ToWorker & { acs: "scrape" }) => void>;
  /** The admission's answers; before it exists, any place the primary gives goes back at once. */
  admitAnswered: (m: AdmitAnswer) => void;
  /** The primary's last shutdown instruction, kept until src/app takes them (onShutdown). */
  shutdownSaid: ShutdownSaid | undefined;
  onShutdown: ShutdownHandlers | undefined;
  /** The "starting" reports, until the worker listens. */
  readonly starting: NodeJS.Timeout;
}

/** This process's worker side when it is a cluster worker of the gateway; else undefined. */
export function joinCluster(logger: Logger): ClusterWorker | undefined {
  const raw = process.env[WORKER_ENV];
  if (!cluster.isWorker || raw === undefined) return undefined;
  const settings = JSON.parse(raw) as WorkerSettings;
  // Until it listens, the worker tells the primary once a second that its event loop turns: the
  // primary replaces a starting worker silent for twice ACS_WORKER_TIMEOUT_MS too (a wait on the
  // store is not silence; a loop stalled is).
  send({ acs: "starting" });
  const starting = setInterval(() => send({ acs: "starting" }), STARTING_REPORT_MS);
  starting.unref();
  const side: WorkerSide = {
    settings,
    logger,
    engineAlive: settings.engineAlive,
    registry: undefined,
    nextId: 0,
    scrapes: new Map(),
    admitAnswered: (m) => {
      if (m.ticket !== undefined) send({ acs: "release", ticket: m.ticket });
    },
    shutdownSaid: undefined,
    onShutdown: undefined,
    starting,
  };
  process.on("message", (m: unknown) => onPrimaryMessage(side, m));
  return {
    slot: settings.slot,
    instanceId: settings.instanceId,
    embeddedModel: settings.embeddedModel,
    engineAlive: () => side.engineAlive,
    registerMetrics: (metrics) => registerMetrics(side, metrics),
    scrape: () => scrapeThroughPrimary(side),
    listening(info) {
      clearInterval(side.starting);
      send({ acs: "listening", info });
    },
    reportReadiness,
    admission(limits) {
      const { admission, answered } = workerAdmission(limits, logger, send, () => side.nextId++);
      side.admitAnswered = answered;
      return admission;
    },
    onShutdown(handlers) {
      side.onShutdown = handlers;
      if (side.shutdownSaid !== undefined) shutdownFor(handlers, side.shutdownSaid);
    },
  };
}

function shutdownFor(handlers: ShutdownHandlers, said: ShutdownSaid): void {
  handlers.drain(said.signal);
  if (said.now) handlers.now(said.signal);
}

/** One message of the primary's. */
function onPrimaryMessage(side: WorkerSide, m: unknown): void {
  if (!isAcsMessage(m)) return;
  const msg = m as ToWorker;
  if (msg.acs === "engine") side.engineAlive = msg.alive;
  else if (msg.acs === "shutdown") {
    side.shutdownSaid = { signal: msg.signal, now: msg.now || side.shutdownSaid?.now === true };
    if (side.onShutdown !== undefined) shutdownFor(side.onShutdown, side.shutdownSaid);
  } else if (msg.acs === "scrape") side.scrapes.get(msg.id)?.(msg);
  else if (msg.acs === "admit") side.admitAnswered(msg);
  else if (msg.acs === "metrics") answerMetricsRead(side, msg.id);
}

/** This worker's metrics for the primary's aggregate (none when its registry cannot be read). */
function answerMetricsRead(side: WorkerSide, id: number): void {
  (side.registry?.getMetricsAsJSON() ?? Promise.resolve([])).then(
    (metrics) => send({ acs: "metrics", id, metrics }),
    (err: unknown) => {
      side.logger.error({ err }, "reading this worker's metrics failed");
      send({ acs: "metrics", id, metrics: [] });
    },
  );
}

/** {@link ClusterWorker.registerMetrics}. */
function registerMetrics(side: WorkerSide, metrics: GatewayMetrics): void {
  side.registry = metrics.registry;
  const worker = String(side.settings.slot);
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
}

/** {@link ClusterWorker.scrape}. */
function scrapeThroughPrimary(side: WorkerSide): Promise<string> {
  const id = side.nextId++;
  return new Promise<string>((resolve, reject) => {
    // Not this worker's own metrics instead: its counters alone are lower than the sums the
    // scrapes before had (a counter reset to Prometheus). A failed scrape is only a gap.
    const fail = (why: string) => {
      side.scrapes.delete(id);
      side.logger.warn({ why }, "the workers' metrics are unavailable: /metrics answers 503");
      reject(
        new ApiError(
          "upstream_unavailable",
          `The gateway's metrics are unavailable: ${why}. Retry the scrape.`,
        ),
      );
    };
    const timer = setTimeout(
      () => fail("the cluster's primary did not answer within 10 s"),
      SCRAPE_ANSWER_MS,
    );
    side.scrapes.set(id, (reply) => {
      clearTimeout(timer);
      side.scrapes.delete(id);
      if (reply.text !== undefined) resolve(reply.text);
      else fail(`the cluster's primary failed to aggregate them (${reply.error ?? "no answer"})`);
    });
    if (!process.send?.({ acs: "scrape", id } satisfies ToPrimary)) {
      clearTimeout(timer);
      fail("this worker has no channel to the cluster's primary");
    }
  });
}

/** {@link ClusterWorker.reportReadiness}: now, at each change and at least once a second. */
function reportReadiness(read: () => Readiness): void {
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
}
