// A pool's `stream`: failover before the first chunk (or, for a caller that collects it, at any
// point), as a plain async iterator over the chosen replica's stream.

import type { UpstreamCallTrace } from "../../core/index.js";
import { attemptRequestId } from "../vllm/ids.js";
import { type UpstreamFault, upstreamFaultOf } from "../vllm/map-upstream-error.js";
import type { VllmCompletionChunk, VllmCompletionRequest } from "../vllm/types.js";
import type { StreamOptions } from "../vllm/vllm-client-types.js";
import { type AttemptSignal, attemptSignal } from "./attempt-signal.js";
import { attemptHeaders, retryableFaults } from "./failover.js";
import {
  anotherCandidate,
  answered,
  failed,
  noneUp,
  type PoolState,
  pick,
  type Replica,
} from "./replica-set.js";

/** One pool stream's state: the request, the replicas tried, and the attempt under way. */
interface PoolStream {
  readonly p: PoolState;
  readonly o: StreamOptions;
  /**
   * The caller collects the stream before answering (a unary call): a failover stays possible
   * after chunks were yielded, `onRestart` told first.
   */
  readonly restartable: boolean;
  /** The request, for a failover: dropped once a chunk reached the caller (none after that). */
  body: VllmCompletionRequest | undefined;
  readonly tried: Set<Replica>;
  /** The attempt's number, from 0 (its upstream request id's suffix); -1 before the first. */
  attempt: number;
  closed: boolean;
  /** The current attempt has yielded a chunk. */
  yielded: boolean;
  /** The current attempt's replica, signal, trace and iterator: set together, cleared together. */
  r: Replica | undefined;
  link: AttemptSignal | undefined;
  trace: UpstreamCallTrace | undefined;
  inner: AsyncIterator<VllmCompletionChunk> | undefined;
}

/**
 * `stream` with failover before the first chunk: a plain async iterator over the chosen
 * replica's stream (no async-generator layer per chunk). An attempt starts at the first `next()`.
 * Errors are the replica's, or the pool's 503 `upstream_unavailable` when no replica is up (or
 * the one chosen was taken out with no other to go to).
 */
export function poolStream(
  p: PoolState,
  request: VllmCompletionRequest,
  o: StreamOptions,
): AsyncIterableIterator<VllmCompletionChunk> {
  const s: PoolStream = {
    p,
    o,
    restartable: o.onRestart !== undefined,
    body: request,
    tried: new Set<Replica>(),
    attempt: -1,
    closed: false,
    yielded: false,
    r: undefined,
    link: undefined,
    trace: undefined,
    inner: undefined,
  };
  // Made once per stream, not per chunk: the fast path's callbacks.
  const onResult = (res: IteratorResult<VllmCompletionChunk>) => ended(s, res);
  const onError = (err: unknown): never => broke(s, err);
  return {
    [Symbol.asyncIterator]() {
      return this;
    },
    next(): Promise<IteratorResult<VllmCompletionChunk>> {
      // Past the first chunk there is no failover: the replica's own chunk, with the end's
      // bookkeeping attached — no async frame per chunk (each would live until the next chunk
      // came, long enough to reach V8's old generation, at every chunk of every stream).
      if (s.yielded && !s.restartable && !s.closed && s.inner !== undefined) {
        return s.inner.next().then(onResult, onError);
      }
      return firstChunk(s);
    },
    return: () => closeStream(s),
  };
}

/** The current attempt is over: its trace ends, its replica's count and signal are released. */
function finishAttempt(s: PoolStream, error?: unknown): void {
  s.trace?.end(error);
  (s.r as Replica).outstanding--;
  s.link?.release();
  s.r = undefined;
  s.link = undefined;
  s.trace = undefined;
  s.inner = undefined;
}

/** The next attempt: a replica not tried yet, its signal, trace and stream; throws noneUp without one. */
function startAttempt(s: PoolStream): void {
  const { p, o } = s;
  s.attempt++;
  const chosen = pick(p, s.tried, "completion");
  if (chosen === undefined) throw noneUp(p);
  s.tried.add(chosen);
  s.r = chosen;
  const link = attemptSignal(chosen, o.signal);
  s.link = link;
  s.yielded = false;
  const upstreamRequestId = attemptRequestId(o.upstreamRequestId, s.attempt);
  const trace = o.trace?.({
    model: p.model,
    replica: chosen.url,
    upstreamRequestId,
    attempt: s.attempt,
    stream: true,
  });
  s.trace = trace;
  try {
    s.inner = chosen.client
      .stream(s.body as VllmCompletionRequest, {
        signal: link.signal,
        upstreamRequestId,
        headers: attemptHeaders(o.headers, trace),
      })
      [Symbol.asyncIterator]();
  } catch (err) {
    finishAttempt(s, err);
    throw err;
  }
}

/**
 * After a failed attempt: the error the caller gets (the attempt is over), or undefined when
 * the request goes on to another replica.
 */
function afterFailure(s: PoolStream, replica: Replica, current: AttemptSignal, err: unknown): unknown {
  let rethrow: unknown;
  if (s.o.signal.aborted) rethrow = err;
  else {
    const takenOut = current.takenOut();
    const fault = takenOut ? "broken" : upstreamFaultOf(err);
    if (!takenOut) failed(s.p, replica, fault, err, "completion");
    if (!failsOver(s, takenOut, fault)) rethrow = takenOut ? noneUp(s.p, err) : err;
  }
  finishAttempt(s, err);
  if (rethrow !== undefined) s.closed = true;
  return rethrow;
}

/**
 * The failover rule: once, before the caller saw a chunk (or at any point when it collects the
 * stream), after a take-out or a retryable fault, while another replica is up.
 */
function failsOver(s: PoolStream, takenOut: boolean, fault: UpstreamFault): boolean {
  return (
    !(s.yielded && !s.restartable) &&
    s.attempt === 0 &&
    (takenOut || retryableFaults.has(fault)) &&
    anotherCandidate(s.p, s.tried)
  );
}

/** Inference's stream ended: the replica answered. */
function ended(s: PoolStream, res: IteratorResult<VllmCompletionChunk>): IteratorResult<VllmCompletionChunk> {
  if (res.done === true) {
    s.closed = true;
    answered(s.p, s.r as Replica, "completion");
    finishAttempt(s);
  }
  return res;
}

/** A chunk past the first failed: the error the caller gets. */
function broke(s: PoolStream, err: unknown): never {
  throw afterFailure(s, s.r as Replica, s.link as AttemptSignal, err);
}

/** Up to the first chunk: an attempt, and the failover to another replica. */
async function firstChunk(s: PoolStream): Promise<IteratorResult<VllmCompletionChunk>> {
  for (;;) {
    if (s.closed) return { value: undefined, done: true };
    if (s.inner === undefined) {
      try {
        startAttempt(s);
      } catch (err) {
        s.closed = true;
        throw err;
      }
    }
    const replica = s.r as Replica;
    const current = s.link as AttemptSignal;
    try {
      const res = await (s.inner as AsyncIterator<VllmCompletionChunk>).next();
      if (res.done === true) return ended(s, res);
      s.yielded = true;
      if (!s.restartable) {
        s.body = undefined;
        current.keep();
      }
      return res;
    } catch (err) {
      const collected = s.yielded;
      const rethrow = afterFailure(s, replica, current, err);
      if (rethrow !== undefined) throw rethrow;
      if (collected) s.o.onRestart?.();
      s.p.failovers++;
    }
  }
}

/** The caller stops early: the replica's stream is returned and the attempt released, once. */
async function closeStream(s: PoolStream): Promise<IteratorResult<VllmCompletionChunk>> {
  if (!s.closed) {
    s.closed = true;
    const current = s.inner;
    if (current !== undefined) {
      try {
        await current.return?.();
      } finally {
        finishAttempt(s);
      }
    }
  }
  return { value: undefined, done: true };
}
