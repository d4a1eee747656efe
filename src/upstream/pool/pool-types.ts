// The public shape of a replica pool: its options, its replicas as it reports them, its interface.
import type { UpstreamFault } from "../vllm/map-upstream-error.js";
import type { VllmClient } from "../vllm/vllm-client-types.js";

/**
 * Where a replica stands: `starting` until its first check ends; `up` (requests go to it);
 * `down` (taken out; checked again after a backoff, and put back when it answers).
 */
export type ReplicaState = "starting" | "up" | "down";

/** Failure kinds counted per replica (see {@link UpstreamFault}). */
export type ReplicaErrorKind = Exclude<UpstreamFault, "none"> | "health";

/** One replica as the pool sees it now. */
export interface ReplicaStatus {
  /** Its base URL, as configured. */
  readonly url: string;
  readonly weight: number;
  readonly state: ReplicaState;
  /** Why it is down (the last failure, or why its check refused it); undefined otherwise. */
  readonly reason: string | undefined;
  /** Requests sent to it and not finished. */
  readonly outstanding: number;
  /** Requests sent to it since start (completions, tokenize, models). */
  readonly requests: number;
  /** Failures since start, by kind (`health`: a failed active check). */
  readonly errors: Readonly<Record<ReplicaErrorKind, number>>;
}

/** One replica given to {@link createUpstreamPool}. */
export interface PoolReplica {
  /** Base URL, for logs and metrics. */
  readonly url: string;
  /** Share of requests relative to the other replicas (≥ 1). @default 1 */
  readonly weight?: number;
  /** The client of that one Inference server. */
  readonly client: VllmClient;
}

/** The log lines of the pool (pino's Logger fits). */
export interface PoolLogger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

/** Options of {@link createUpstreamPool}. Times in milliseconds. */
export interface UpstreamPoolOptions {
  /** The model the replicas run, for logs and messages. */
  readonly model: string;
  readonly replicas: readonly PoolReplica[];
  /**
   * Runs on a replica before it is put in (at start and each time it comes back), after its
   * `/health` answered 200; throws an Error whose message says why it is kept out (e.g. it serves
   * another model). @default none
   */
  readonly admit?: (client: VllmClient, signal: AbortSignal) => Promise<void>;
  /** `GET /health` of each replica that is up, this often; 0 = only passive checks. @default 5000 */
  readonly healthIntervalMs?: number;
  /** Longest wait for a check (`/health`, then `admit`). @default 5000 */
  readonly checkTimeoutMs?: number;
  /** Wait before checking a replica that was taken out: doubles each time, up to maxMs. @default 1000, 30000 */
  readonly backoff?: { readonly initialMs?: number; readonly maxMs?: number };
  /**
   * Failures in a row that take a replica out without a check: of any call, with no answer between
   * them that ends the run — a completion's answer ends any run, a control call's (`/tokenize`,
   * `/v1/models`…) only a run since its last completion answered. @default 3
   */
  readonly failureThreshold?: number;
  readonly logger?: PoolLogger;
}

/**
 * The replicas of one model behind the interface of one Inference client ({@link VllmClient}), so
 * the service does not know there are several. Knows nothing of completions.
 */
export interface UpstreamPool extends VllmClient {
  /** True while at least one replica is up. */
  serving(): boolean;
  /** Every replica, in configuration order. */
  replicas(): ReplicaStatus[];
  /** Requests sent again to another replica since start. */
  failovers(): number;
  /** Resolves once every replica has had its first check, whatever its outcome. */
  ready(): Promise<void>;
}
