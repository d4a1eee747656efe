import { ApiError } from "../../errors/index.js";
import { attemptRequestId } from "../vllm/ids.js";
import { type UpstreamFault, upstreamFaultOf } from "../vllm/map-upstream-error.js";
import type {
  VllmCompletion,
  VllmCompletionChunk,
  VllmCompletionRequest,
  VllmDetokenizeResponse,
  VllmModelList,
  VllmTokenizeResponse,
} from "../vllm/types.js";
import type {
  CompleteOptions,
  StreamOptions,
  TokenizeResult,
  VllmClient,
} from "../vllm/vllm-client-types.js";
import { chooseReplica } from "./choose-replica.js";

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
  /** Failures in a row (no answer between them) that take a replica out without a check. @default 3 */
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

interface Replica {
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
  /** Failures since its last answer. */
  failuresInARow: number;
  /** Take-outs since its last answer: the backoff's exponent. */
  backoffLevel: number;
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
interface Attempt {
  readonly controller: AbortController;
  /** The replica was taken out while the attempt had no output. */
  takenOut: boolean;
}

/** Per attempt: the caller's signal and the replica's take-out, as one signal. */
interface AttemptSignal {
  readonly signal: AbortSignal;
  /** True when the replica was taken out (not the caller) while the attempt waited. */
  takenOut(): boolean;
  /** Output reached the caller: a take-out no longer aborts the attempt. */
  keep(): void;
  release(): void;
}

function attemptSignal(replica: Replica, caller: AbortSignal | undefined): AttemptSignal {
  const controller = new AbortController();
  const attempt: Attempt = { controller, takenOut: false };
  let kept = false;
  const onCaller = () => controller.abort(caller?.reason);
  if (caller?.aborted) onCaller();
  caller?.addEventListener("abort", onCaller, { once: true });
  replica.attempts.add(attempt);
  return {
    signal: controller.signal,
    takenOut: () => !kept && attempt.takenOut && caller?.aborted !== true,
    keep() {
      kept = true;
      replica.attempts.delete(attempt);
    },
    release() {
      caller?.removeEventListener("abort", onCaller);
      replica.attempts.delete(attempt);
    },
  };
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

const noHeaders: Readonly<Record<string, string>> = Object.freeze({});

/**
 * Faults after which a request whose caller has seen nothing may go to another replica: every
 * fault of the replica's (refused, reset, garbage, 503, 5xx, silence).
 */
const retryableFaults: ReadonlySet<UpstreamFault> = new Set([
  "unreachable",
  "broken",
  "unavailable",
  "rejected",
  "server_error",
  "silent",
]);

/**
 * A pool over the replicas of one model.
 *
 * - Choice: the up replica with the fewest outstanding requests per unit of weight
 *   ({@link chooseReplica}).
 * - Health, active: each replica's `GET /health` every `healthIntervalMs` while up; a replica that
 *   is starting or down must also pass `admit` (e.g. serve the right model) to be put in.
 * - Health, passive: a replica that refuses connections, or refuses the gateway (401/403, unknown
 *   model), is taken out at once; a broken connection, a 503, a silence (no first event within the
 *   client's bound) or a stream cut short trigger a check at once (taken out if it fails);
 *   `failureThreshold` failures in a row of any kind (5xx and silences included) take it out. A
 *   taken-out replica is checked again after a backoff (doubling from `backoff.initialMs` to
 *   `backoff.maxMs`) and put back when it answers; requests on it that had no output yet are
 *   aborted and go to another replica.
 * - Failover, keyed on what reached the caller: a request whose call failed before the caller saw
 *   anything (refused, reset, garbage, 503, another 5xx, silence, a replica that died or was taken
 *   out) goes once to another up replica, with a new upstream request id (an id is never sent
 *   twice to a replica). For `stream` that is before its first chunk is yielded — or, for a caller
 *   that collects the stream before answering (`onRestart` set: a unary call), at any point, the
 *   caller told to drop what it collected; for `complete`, until its whole answer. Never after.
 * - Every replica down: `upstream_unavailable` (503) at once.
 */
export function createUpstreamPool(options: UpstreamPoolOptions): UpstreamPool {
  const { model, logger } = options;
  const healthIntervalMs = options.healthIntervalMs ?? 5000;
  const checkTimeoutMs = options.checkTimeoutMs ?? 5000;
  const backoffInitialMs = options.backoff?.initialMs ?? 1000;
  const backoffMaxMs = options.backoff?.maxMs ?? 30_000;
  const failureThreshold = options.failureThreshold ?? 3;
  if (options.replicas.length === 0) throw new RangeError(`model ${model}: a pool needs a replica`);
  const closing = new AbortController();
  let failoverCount = 0;

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
    backoffLevel: 0,
    timer: undefined,
    checking: undefined,
    attempts: new Set(),
  }));

  const backoffMs = (level: number) => Math.min(backoffMaxMs, backoffInitialMs * 2 ** Math.min(level, 30));

  function schedule(r: Replica): void {
    if (r.timer !== undefined) clearTimeout(r.timer);
    r.timer = undefined;
    if (closing.signal.aborted) return;
    const delay = r.state === "up" ? healthIntervalMs : backoffMs(Math.max(0, r.backoffLevel - 1));
    if (delay <= 0) return;
    r.timer = setTimeout(() => {
      r.timer = undefined;
      void check(r);
    }, delay);
    r.timer.unref();
  }

  function putIn(r: Replica): void {
    if (r.state === "up") return;
    const was = r.state;
    // Level with the replicas already up: a returning replica does not take every request.
    const up = replicas.filter((o) => o !== r && o.state === "up");
    if (up.length > 0) r.sent = r.weight * Math.min(...up.map((o) => o.sent / o.weight));
    r.state = "up";
    r.reason = undefined;
    r.failuresInARow = 0;
    logger?.info({ model, replica: r.url, was }, `replica of ${model} at ${r.url} is up`);
  }

  function takeOut(r: Replica, reason: string): void {
    if (r.state === "down") {
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
    const takenOut = new ApiError("upstream_unavailable", `The replica was taken out: ${reason}`);
    const attempts = [...r.attempts];
    r.attempts.clear();
    for (const attempt of attempts) {
      attempt.takenOut = true;
      attempt.controller.abort(takenOut);
    }
    const retryInMs = backoffMs(r.backoffLevel - 1);
    logger?.warn(
      { model, replica: r.url, reason, retryInMs, was },
      `replica of ${model} at ${r.url} is down: ${reason}`,
    );
    schedule(r);
  }

  /** The active check: `/health`, then `admit` unless the replica is up. One at a time. */
  function check(r: Replica): Promise<void> {
    if (r.checking !== undefined) return r.checking;
    r.checking = (async () => {
      // Per check, not AbortSignal.any over the pool's long-lived signal (which would keep every
      // check's signal alive until the pool closes).
      const controller = new AbortController();
      const onClose = () => controller.abort();
      closing.signal.addEventListener("abort", onClose, { once: true });
      const timer = setTimeout(() => controller.abort(), checkTimeoutMs);
      const signal = controller.signal;
      try {
        await runCheck(r, signal);
      } finally {
        clearTimeout(timer);
        closing.signal.removeEventListener("abort", onClose);
      }
    })().finally(() => {
      r.checking = undefined;
    });
    return r.checking;
  }

  /** One check of `r` (see {@link check}), then its next one scheduled. */
  async function runCheck(r: Replica, signal: AbortSignal): Promise<void> {
    let refusal: string | undefined;
    if (!(await r.client.health(signal))) {
      refusal = `GET /health failed (no 200 within ${checkTimeoutMs} ms)`;
      r.errors.health++;
    } else if (r.state !== "up" && options.admit !== undefined) {
      try {
        await options.admit(r.client, signal);
      } catch (err) {
        refusal = err instanceof Error ? err.message : String(err);
        r.errors.health++;
      }
    }
    if (closing.signal.aborted) return;
    if (refusal === undefined) {
      putIn(r);
      schedule(r);
    } else if (r.state === "down") {
      // Still down: the reason may have changed; the next check waits longer.
      takeOut(r, refusal);
      r.backoffLevel++;
      schedule(r);
    } else {
      takeOut(r, refusal);
    }
  }

  /** The replica answered (whatever it answered): its failures in a row end. */
  function answered(r: Replica): void {
    r.failuresInARow = 0;
    r.backoffLevel = 0;
  }

  /** Passive health: what a failed call says about its replica. */
  function failed(r: Replica, fault: UpstreamFault, err: unknown): void {
    if (fault === "none") {
      answered(r);
      return;
    }
    r.errors[fault]++;
    r.failuresInARow++;
    const reason = `${fault.replace("_", " ")}: ${err instanceof Error ? err.message : String(err)}`;
    if (r.state !== "up") return;
    if (fault === "unreachable" || fault === "rejected" || r.failuresInARow >= failureThreshold) {
      takeOut(r, reason);
    } else if (fault !== "server_error") {
      void check(r);
    }
  }

  /** The up replica for the next request, not one of `tried`; undefined when there is none. */
  function pick(tried: ReadonlySet<Replica>): Replica | undefined {
    const candidates = replicas.filter((r) => r.state === "up" && !tried.has(r));
    const chosen = candidates[chooseReplica(candidates)];
    if (chosen === undefined) return undefined;
    chosen.outstanding++;
    chosen.requests++;
    chosen.sent++;
    return chosen;
  }

  const noneUp = (cause?: unknown): ApiError =>
    new ApiError("upstream_unavailable", `Inference is unavailable: no replica of ${model} is up.`, {
      ...(cause === undefined ? {} : { cause }),
    });

  /**
   * One call with failover: `call` runs on a chosen replica; when it fails before output with a
   * fault that `mayRetry` allows, it runs once more on another replica (attempt 1).
   */
  async function withFailover<T>(
    caller: AbortSignal | undefined,
    mayRetry: (fault: UpstreamFault, err: unknown) => boolean,
    call: (client: VllmClient, signal: AbortSignal, attempt: number, replica: string) => Promise<T>,
  ): Promise<T> {
    const tried = new Set<Replica>();
    for (let attempt = 0; ; attempt++) {
      const r = pick(tried);
      if (r === undefined) throw noneUp();
      tried.add(r);
      const link = attemptSignal(r, caller);
      try {
        const result = await call(r.client, link.signal, attempt, r.url);
        answered(r);
        return result;
      } catch (err) {
        if (caller?.aborted) throw err;
        const takenOut = link.takenOut();
        const fault = takenOut ? "broken" : upstreamFaultOf(err);
        if (!takenOut) failed(r, fault, err);
        if (attempt > 0 || !(takenOut || mayRetry(fault, err))) throw takenOut ? noneUp(err) : err;
        if (!replicas.some((o) => o.state === "up" && !tried.has(o))) throw takenOut ? noneUp(err) : err;
        failoverCount++;
      } finally {
        r.outstanding--;
        link.release();
      }
    }
  }

  const idempotentRetry = (fault: UpstreamFault) => retryableFaults.has(fault);

  /**
   * `stream` with failover before the first chunk: a plain async iterator over the chosen
   * replica's stream (no async-generator layer per chunk). An attempt starts at the first `next()`.
   */
  function stream(
    request: VllmCompletionRequest,
    o: StreamOptions,
  ): AsyncIterableIterator<VllmCompletionChunk> {
    /**
     * The caller collects the stream before answering (a unary call): a failover stays possible
     * after chunks were yielded, `onRestart` told first.
     */
    const restartable = o.onRestart !== undefined;
    /** The request, for a failover: dropped once a chunk reached the caller (none after that). */
    let body: VllmCompletionRequest | undefined = request;
    const tried = new Set<Replica>();
    let attempt = -1;
    let closed = false;
    let yielded = false;
    let r: Replica | undefined;
    let link: AttemptSignal | undefined;
    let trace: ReturnType<NonNullable<StreamOptions["trace"]>> | undefined;
    let inner: AsyncIterator<VllmCompletionChunk> | undefined;

    /** The current attempt is over: its trace ends, its replica's count and signal are released. */
    const finish = (error?: unknown): void => {
      trace?.end(error);
      (r as Replica).outstanding--;
      link?.release();
      r = undefined;
      link = undefined;
      trace = undefined;
      inner = undefined;
    };

    const start = (): void => {
      attempt++;
      const chosen = pick(tried);
      if (chosen === undefined) throw noneUp();
      tried.add(chosen);
      r = chosen;
      link = attemptSignal(chosen, o.signal);
      yielded = false;
      const upstreamRequestId = attemptRequestId(o.upstreamRequestId, attempt);
      trace = o.trace?.({ model, replica: chosen.url, upstreamRequestId, attempt, stream: true });
      try {
        inner = chosen.client
          .stream(body as VllmCompletionRequest, {
            signal: link.signal,
            upstreamRequestId,
            headers: trace === undefined ? (o.headers ?? noHeaders) : { ...o.headers, ...trace.headers },
          })
          [Symbol.asyncIterator]();
      } catch (err) {
        finish(err);
        throw err;
      }
    };

    /**
     * After a failed attempt: the error the caller gets (the attempt is over), or undefined when
     * the request goes on to another replica.
     */
    const afterFailure = (replica: Replica, current: AttemptSignal, err: unknown): unknown => {
      let rethrow: unknown;
      if (o.signal.aborted) rethrow = err;
      else {
        const takenOut = current.takenOut();
        const fault = takenOut ? "broken" : upstreamFaultOf(err);
        if (!takenOut) failed(replica, fault, err);
        if (
          (yielded && !restartable) ||
          attempt > 0 ||
          !(takenOut || retryableFaults.has(fault)) ||
          !replicas.some((x) => x.state === "up" && !tried.has(x))
        ) {
          rethrow = takenOut ? noneUp(err) : err;
        }
      }
      finish(err);
      if (rethrow !== undefined) closed = true;
      return rethrow;
    };

    /** Inference's stream ended: the replica answered. */
    const ended = (res: IteratorResult<VllmCompletionChunk>): IteratorResult<VllmCompletionChunk> => {
      if (res.done === true) {
        closed = true;
        answered(r as Replica);
        finish();
      }
      return res;
    };
    const broke = (err: unknown): never => {
      throw afterFailure(r as Replica, link as AttemptSignal, err);
    };

    /** Up to the first chunk: an attempt, and the failover to another replica. */
    const firstChunk = async (): Promise<IteratorResult<VllmCompletionChunk>> => {
      for (;;) {
        if (closed) return { value: undefined, done: true };
        if (inner === undefined) {
          try {
            start();
          } catch (err) {
            closed = true;
            throw err;
          }
        }
        const replica = r as Replica;
        const current = link as AttemptSignal;
        try {
          const res = await (inner as AsyncIterator<VllmCompletionChunk>).next();
          if (res.done === true) return ended(res);
          yielded = true;
          if (!restartable) {
            body = undefined;
            current.keep();
          }
          return res;
        } catch (err) {
          const collected = yielded;
          const rethrow = afterFailure(replica, current, err);
          if (rethrow !== undefined) throw rethrow;
          if (collected) o.onRestart?.();
          failoverCount++;
        }
      }
    };

    return {
      [Symbol.asyncIterator]() {
        return this;
      },
      next(): Promise<IteratorResult<VllmCompletionChunk>> {
        // Past the first chunk there is no failover: the replica's own chunk, with the end's
        // bookkeeping attached — no async frame per chunk (each would live until the next chunk
        // came, long enough to reach V8's old generation, at every chunk of every stream).
        if (yielded && !restartable && !closed && inner !== undefined) return inner.next().then(ended, broke);
        return firstChunk();
      },
      async return(): Promise<IteratorResult<VllmCompletionChunk>> {
        if (!closed) {
          closed = true;
          const current = inner;
          if (current !== undefined) {
            try {
              await current.return?.();
            } finally {
              finish();
            }
          }
        }
        return { value: undefined, done: true };
      },
    };
  }

  const firstChecks = Promise.all(replicas.map((r) => check(r))).then(() => undefined);

  return {
    complete(body: VllmCompletionRequest, o: CompleteOptions): Promise<VllmCompletion> {
      const start = Date.now();
      return withFailover(
        o.signal,
        // The caller sees nothing before the whole answer: any fault of the replica's.
        idempotentRetry,
        async (client, signal, attempt, replica) => {
          const upstreamRequestId = attemptRequestId(o.upstreamRequestId, attempt);
          const trace = o.trace?.({ model, replica, upstreamRequestId, attempt, stream: false });
          try {
            const result = await client.complete(body, {
              signal,
              deadlineMs: Math.max(1, o.deadlineMs - (Date.now() - start)),
              upstreamRequestId,
              headers: trace === undefined ? (o.headers ?? noHeaders) : { ...o.headers, ...trace.headers },
            });
            trace?.end();
            return result;
          } catch (err) {
            trace?.end(err);
            throw err;
          }
        },
      );
    },

    stream,

    tokenize(servedModel: string, prompt: string, addSpecialTokens: boolean, signal?: AbortSignal) {
      return withFailover<TokenizeResult>(signal, idempotentRetry, (client, s) =>
        client.tokenize(servedModel, prompt, addSpecialTokens, s),
      );
    },

    // A caller's control calls: idempotent, so failed over like /tokenize (`<id>-retry` on the second).
    tokenizeText(body, o) {
      return withFailover<VllmTokenizeResponse>(o.signal, idempotentRetry, (client, signal, attempt) =>
        client.tokenizeText(body, {
          signal,
          upstreamRequestId: attemptRequestId(o.upstreamRequestId, attempt),
        }),
      );
    },

    detokenize(body, o) {
      return withFailover<VllmDetokenizeResponse>(o.signal, idempotentRetry, (client, signal, attempt) =>
        client.detokenize(body, {
          signal,
          upstreamRequestId: attemptRequestId(o.upstreamRequestId, attempt),
        }),
      );
    },

    listModels(signal?: AbortSignal): Promise<VllmModelList> {
      return withFailover(signal, idempotentRetry, (client, s) => client.listModels(s));
    },

    async health() {
      return replicas.some((r) => r.state === "up");
    },

    serving: () => replicas.some((r) => r.state === "up"),

    replicas: () =>
      replicas.map((r) => ({
        url: r.url,
        weight: r.weight,
        state: r.state,
        reason: r.reason,
        outstanding: r.outstanding,
        requests: r.requests,
        errors: { ...r.errors },
      })),

    failovers: () => failoverCount,

    ready: () => firstChecks,

    async close() {
      closing.abort();
      for (const r of replicas) {
        if (r.timer !== undefined) clearTimeout(r.timer);
        r.timer = undefined;
      }
      await Promise.all(replicas.map((r) => r.client.close()));
    },
  };
}
