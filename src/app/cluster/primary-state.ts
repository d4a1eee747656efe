// The cluster primary's state: its options, one slot per worker, and the counts the files of
// src/app/cluster/ read and change (primary.ts runs it).
import type { Worker } from "node:cluster";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { Config, ModelConfig } from "../../config/index.js";
import type { AdmissionTicket, LocalAdmission } from "../../service/admission.js";
import type { Readiness } from "../../surfaces/http/ops-server.js";
import type { MetricsJson, WorkerMetricsMemory } from "../worker-metrics.js";
import type { ListeningInfo } from "./ipc.js";

/** The embedded engine as the primary runs it (src/app/embedded-engine.ts). */
export interface PrimaryEngine {
  readonly model: ModelConfig;
  isAlive(): boolean;
  stop(): Promise<void>;
}

/** Options of the primary (src/app/cluster/primary.ts `runPrimary`). */
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

/** One worker's place (1..N): the worker in it now, and what the primary knows of it. */
export interface Slot {
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

/** A scrape waiting for workers' answers: the answers by slot, the slots still waiting. */
export interface PendingScrape {
  readonly got: Map<number, MetricsJson>;
  readonly waiting: Set<number>;
  /** Read as they last answered (their channel closed, or they answered nothing). */
  readonly silent: Set<number>;
  readonly done: () => void;
}

/** The primary's metrics: its own registry, the scrapes in progress and the workers' last answers. */
export interface ClusterScrapes {
  /** `acs_cluster_*` (src/app/cluster/metrics.ts). */
  readonly registry: Registry;
  readonly pending: Map<number, PendingScrape>;
  nextScrape: number;
  readonly memory: WorkerMetricsMemory;
}

/** The primary's state. */
export interface Primary {
  readonly options: PrimaryOptions;
  readonly config: Config;
  readonly logger: Logger;
  readonly engine: PrimaryEngine | undefined;
  /** The workers' instance ids are `<base>/w<slot>`. */
  readonly base: string;
  readonly minUptimeMs: number;
  readonly slots: readonly Slot[];
  /** The per-key caps of every worker (src/app/cluster/admission-broker.ts). */
  readonly admission: LocalAdmission;
  nextTicket: number;
  closing: boolean;
  /** A worker did not end cleanly while closing: the primary exits 1. */
  unclean: boolean;
  restarts: number;
  timeouts: number;
  /** The first worker's "listening" report: the URL of the one "listening" line. */
  first: ListeningInfo | undefined;
  announced: boolean;
  /** While worker 1 starts alone: ends the start with its exit code. */
  startFailed: ((code: number) => void) | undefined;
  readonly scrapes: ClusterScrapes;
}

/** A slot not yet forked. */
export function emptySlot(n: number): Slot {
  return {
    n,
    worker: undefined,
    listening: false,
    startedAt: 0,
    delayMs: 100,
    places: new Map(),
    readiness: undefined,
    heardAt: 0,
    timedOut: false,
    reported: false,
  };
}
