// The replicas of one pool and their health: the pool's state in one small object, and the
// functions that choose a replica, put one in, take one out and check it (active and passive).
import { ApiError } from "../../core/errors/index.js";
import type { UpstreamFault } from "../vllm/map-upstream-error.js";
import type { VllmClient } from "../vllm/vllm-client-types.js";
import { chooseReplica } from "./choose-replica.js";
import type { PoolLogger, ReplicaErrorKind, ReplicaState, UpstreamPoolOptions } from "./pool-types.js";

export interface Replica {
  readonly url: string;
  readonly weight: number;
  readonly client: VllmClient;
  state: ReplicaState;
  reason: string | undefined;
  outstanding: number;
  requests: number;
  /** The choice's virtual clock (see ReplicaLoad.sent). */
  sent: number;
  errors: Record<ReplicaErrorKind, number>;
  /** Failures since the answer that ended its last run ({@link answered}), or since it was put in. */
  failuresInARow: number;
  /**
   * Its last completion failed: until a completion answers, the answers of its control calls end
   * neither its run of failures nor its backoff ({@link answered}).
   */
  completionFailed: boolean;
  /** Take-outs since the answer that ended its last run: the backoff's exponent. */
  backoffLevel: number;
  /** Take-outs since start: a check that began before the last one does not decide its state. */
  takeOuts: number;
  /**
   * Taken out only for `failureThreshold` failures in a row (outlier ejection): it still answers
   * connections and its checks. While no replica is up, requests go to such a replica (panic
   * mode, {@link pick}); cleared when it is put back or a check refuses it.
   */
  ejected: boolean;
  timer: NodeJS.Timeout | undefined;
  checking: Promise<void> | undefined;
  /**
   * The attempts on it without output yet: aborted when the replica is taken out (they go
   * elsewhere). A set, not `abort` listeners on one long-lived signal: Node's EventTarget walks its
   * listener list on every add and remove, O(requests in flight) each (23 µs at 5,000 streams).
   */
  readonly attempts: Set<Attempt>;
}

/** One attempt on a replica, while it is in the replica's `attempts`. */
export interface Attempt {
  readonly controller: AbortController;
  /** The replica was taken out while the attempt had no output. */
  takenOut: boolean;
}

/** One pool's state: its settings, its replicas, whether it is closing, its failovers. */
export interface PoolState {
  readonly options: UpstreamPoolOptions;
  readonly model: string;
  readonly logger: PoolLogger | undefined;
  readonly healthIntervalMs: number;
  readonly checkTimeoutMs: number;
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  readonly failureThreshold: number;
  readonly closing: AbortController;
  readonly replicas: Replica[];
  /** Requests sent again to another replica since start. */
  failovers: number;
}

const zeroErrors = (): Record<ReplicaErrorKind, number> => ({
  unreachable: 0,
  broken: 0,
  unavailable: 0,
  rejected: 0,
  server_error: 0,
  silent: 0,
  health: 0,
});

/** The state of a pool over `options.replicas`, each `starting`; throws RangeError without one. */
export function poolState(options: UpstreamPoolOptions): PoolState {
  const { model, logger } = options;
  const healthIntervalMs = options.healthIntervalMs ?? 5000;
  const checkTimeoutMs = options.checkTimeoutMs ?? 5000;
  const backoffInitialMs = options.backoff?.initialMs ?? 1000;
  const backoffMaxMs = options.backoff?.maxMs ?? 30_000;
  const failureThreshold = options.failureThreshold ?? 3;
  if (options.replicas.length === 0) throw new RangeError(`model ${model}: a pool needs a replica`);
  const closing = new AbortController();
  const replicas: Replica[] = options.replicas.map((r) => ({
    url: r.url,
    weight: r.weight ?? 1,
    client: r.client,
    state: "starting",
    reason: undefined,
    outstanding: 0,
    requests: 0,
    sent: 0,
    errors: zeroErrors(),
    failuresInARow: 0,
    completionFailed: false,
    backoffLevel: 0,
    takeOuts: 0,
    ejected: false,
    timer: undefined,
    checking: undefined,
    attempts: new Set(),
  }));
  return {
    options,
    model,
    logger,
    healthIntervalMs,
    checkTimeoutMs,
    backoffInitialMs,
    backoffMaxMs,
    failureThreshold,
    closing,
    replicas,
    failovers: 0,
  };
}

const backoffMs = (p: PoolState, level: number) =>
  Math.min(p.backoffMaxMs, p.backoffInitialMs * 2 ** Math.min(level, 30));

function schedule(p: PoolState, r: Replica): void {
  if (r.timer !== undefined) clearTimeout(r.timer);
  r.timer = undefined;
  if (p.closing.signal.aborted) return;
  const delay = r.state === "up" ? p.healthIntervalMs : backoffMs(p, Math.max(0, r.backoffLevel - 1));
  if (delay <= 0) return;
  r.timer = setTimeout(() => {
    r.timer = undefined;
    void check(p, r);
  }, delay);
  r.timer.unref();
}

function putIn(p: PoolState, r: Replica): void {
  if (r.state === "up") return;
  const was = r.state;
  // Level with the replicas already up: a returning replica does not take every request.
  const up = p.replicas.filter((o) => o !== r && o.state === "up");
  if (up.length > 0) r.sent = r.weight * Math.min(...up.map((o) => o.sent / o.weight));
  r.state = "up";
  r.reason = undefined;
  r.ejected = false;
  // A new run; `completionFailed` stays, so that its control calls' answers do not end the
  // backoff of a replica whose completions still fail.
  r.failuresInARow = 0;
  p.logger?.info({ model: p.model, replica: r.url, was }, `replica of ${p.model} at ${r.url} is up`);
}

/**
 * Takes `r` out for `reason`. An `ejection` (failures in a row, nothing else wrong) leaves it
 * eligible for panic mode; its attempts without output are aborted (they go elsewhere) unless no
 * other replica is up, where they would have nowhere to go.
 */
function takeOut(p: PoolState, r: Replica, reason: string, ejection = false): void {
  const { model, logger } = p;
  r.ejected = ejection;
  if (r.state === "down") {
    // Attempts left running in panic mode go once a check refuses it.
    if (!ejection) abortAttempts(r, reason);
    if (reason !== r.reason) {
      r.reason = reason;
      logger?.warn(
        { model, replica: r.url, reason },
        `replica of ${model} at ${r.url} is still down: ${reason}`,
      );
    }
    return;
  }
  const was = r.state;
  r.state = "down";
  r.reason = reason;
  r.backoffLevel++;
  r.takeOuts++;
  if (!(ejection && !p.replicas.some((o) => o.state === "up"))) abortAttempts(r, reason);
  const retryInMs = backoffMs(p, r.backoffLevel - 1);
  logger?.warn(
    { model, replica: r.url, reason, retryInMs, was },
    `replica of ${model} at ${r.url} is down: ${reason}`,
  );
  schedule(p, r);
}

/** Aborts `r`'s attempts without output: the replica was taken out (they go to another). */
function abortAttempts(r: Replica, reason: string): void {
  const takenOut = new ApiError("upstream_unavailable", `The replica was taken out: ${reason}`);
  const attempts = [...r.attempts];
  r.attempts.clear();
  for (const attempt of attempts) {
    attempt.takenOut = true;
    attempt.controller.abort(takenOut);
  }
}

/** The active check: `/health`, then `admit` unless the replica is up. One at a time. */
export function check(p: PoolState, r: Replica): Promise<void> {
  if (r.checking !== undefined) return r.checking;
  r.checking = (async () => {
    // Per check, not AbortSignal.any over the pool's long-lived signal (which would keep every
    // check's signal alive until the pool closes).
    const controller = new AbortController();
    const onClose = () => controller.abort();
    p.closing.signal.addEventListener("abort", onClose, { once: true });
    const timer = setTimeout(() => controller.abort(), p.checkTimeoutMs);
    const signal = controller.signal;
    try {
      await runCheck(p, r, signal);
    } finally {
      clearTimeout(timer);
      p.closing.signal.removeEventListener("abort", onClose);
    }
  })().finally(() => {
    r.checking = undefined;
  });
  return r.checking;
}

/** One check of `r` (see {@link check}), then its next one scheduled. */
async function runCheck(p: PoolState, r: Replica, signal: AbortSignal): Promise<void> {
  const takeOuts = r.takeOuts;
  let refusal: string | undefined;
  if (!(await r.client.health(signal))) {
    refusal = `GET /health failed (no 200 within ${p.checkTimeoutMs} ms)`;
    r.errors.health++;
  } else if (r.state !== "up" && p.options.admit !== undefined) {
    try {
      await p.options.admit(r.client, signal);
    } catch (err) {
      refusal = err instanceof Error ? err.message : String(err);
      r.errors.health++;
    }
  }
  // Taken out while it ran (failures in a row, a refusal): the take-out's own backoff check
  // decides, not this one — which may have begun while it was up (and skipped `admit`).
  if (p.closing.signal.aborted || r.takeOuts !== takeOuts) return;
  if (refusal === undefined) {
    putIn(p, r);
    schedule(p, r);
  } else if (r.state === "down") {
    // Still down: the reason may have changed; the next check waits longer.
    takeOut(p, r, refusal);
    r.backoffLevel++;
    schedule(p, r);
  } else {
    takeOut(p, r, refusal);
  }
}

/**
 * The replica answered a call of `work` (whatever it answered): its run of failures and its
 * backoff end — unless that call was a control call and its last completion failed. Only a
 * completion's answer ends a run of failed completions: a replica that answers `/tokenize` and
 * `/health` but fails every completion must still reach `failureThreshold`.
 */
export function answered(p: PoolState, r: Replica, work: CallWork): void {
  if (work === "control" && r.completionFailed) return;
  r.failuresInARow = 0;
  r.completionFailed = false;
  r.backoffLevel = 0;
  // Panic mode's replica answered a completion: it serves again (its checks still pass).
  if (work === "completion" && r.ejected && r.state === "down") {
    putIn(p, r);
    schedule(p, r);
  }
}

/** Passive health: what a failed call of `work` says about its replica. */
export function failed(p: PoolState, r: Replica, fault: UpstreamFault, err: unknown, work: CallWork): void {
  if (fault === "none") {
    answered(p, r, work);
    return;
  }
  r.errors[fault]++;
  r.failuresInARow++;
  if (work === "completion") r.completionFailed = true;
  const reason = `${fault.replace("_", " ")}: ${err instanceof Error ? err.message : String(err)}`;
  const refuses = fault === "unreachable" || fault === "rejected";
  // Down: only an ejected replica (panic mode's) is still sent requests; one that refuses them
  // is down for a reason of its own now, and panic mode no longer chooses it.
  if (r.state !== "up") {
    if (r.ejected && refuses) takeOut(p, r, reason);
    return;
  }
  if (refuses) takeOut(p, r, reason);
  else if (r.failuresInARow >= p.failureThreshold) {
    takeOut(p, r, reason, true);
  } else if (fault !== "server_error") {
    void check(p, r);
  }
}

/** What a call asks of a replica: a completion, or a control call (`/tokenize`, `/v1/models`…). */
export type CallWork = "completion" | "control";

/**
 * The replicas a request may go to, not one of `tried`: those up; while none is up, those taken
 * out for failures in a row only (ejected) — Envoy's panic mode, so that a model's lone replica
 * keeps passing on its own answers and errors rather than a 503 for its whole backoff, and a
 * failed attempt still goes to another ejected one. A replica that refuses connections or the
 * gateway, or failed its check, is never among them.
 */
function candidates(p: PoolState, tried: ReadonlySet<Replica>): Replica[] {
  const up = p.replicas.filter((r) => r.state === "up" && !tried.has(r));
  if (up.length > 0 || p.replicas.some((r) => r.state === "up")) return up;
  return p.replicas.filter((r) => r.ejected && !tried.has(r));
}

/**
 * The replica for the next request, among its {@link candidates}; undefined when there is none.
 * Only completions advance the choice's clock (`sent`): a text prompt's `/tokenize` goes before
 * its completion, and if it counted too the two would alternate replicas and every completion
 * would land on the same one.
 */
export function pick(p: PoolState, tried: ReadonlySet<Replica>, work: CallWork): Replica | undefined {
  const open = candidates(p, tried);
  const chosen = open[chooseReplica(open)];
  if (chosen === undefined) return undefined;
  chosen.outstanding++;
  chosen.requests++;
  if (work === "completion") chosen.sent++;
  return chosen;
}

/** True while a request that failed on `tried` may go to another replica ({@link candidates}). */
export const anotherCandidate = (p: PoolState, tried: ReadonlySet<Replica>): boolean =>
  candidates(p, tried).length > 0;

/** The 503 of a request with no replica up (or whose replica was taken out). */
export const noneUp = (p: PoolState, cause?: unknown): ApiError =>
  new ApiError("upstream_unavailable", `Inference is unavailable: no replica of ${p.model} is up.`, {
    ...(cause === undefined ? {} : { cause }),
  });
