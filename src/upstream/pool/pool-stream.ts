// A pool's `stream`: failover before the first chunk (or, for a caller that collects it, at any
// point), as a plain async iterator over the chosen replica's stream.

import { attemptRequestId } from "../vllm/ids.js";
import { upstreamFaultOf } from "../vllm/map-upstream-error.js";
import type { VllmCompletionChunk, VllmCompletionRequest } from "../vllm/types.js";
import type { StreamOptions } from "../vllm/vllm-client-types.js";
import { type AttemptSignal, attemptSignal } from "./attempt-signal.js";
import { attemptHeaders, retryableFaults } from "./failover.js";
import { anotherUp, answered, failed, noneUp, type PoolState, pick, type Replica } from "./replica-set.js";

/**
 * `stream` with failover before the first chunk: a plain async iterator over the chosen
 * replica's stream (no async-generator layer per chunk). An attempt starts at the first `next()`.
 */
export function poolStream(
  p: PoolState,
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
    const chosen = pick(p, tried, "completion");
    if (chosen === undefined) throw noneUp(p);
    tried.add(chosen);
    r = chosen;
    link = attemptSignal(chosen, o.signal);
    yielded = false;
    const upstreamRequestId = attemptRequestId(o.upstreamRequestId, attempt);
    trace = o.trace?.({ model: p.model, replica: chosen.url, upstreamRequestId, attempt, stream: true });
    try {
      inner = chosen.client
        .stream(body as VllmCompletionRequest, {
          signal: link.signal,
          upstreamRequestId,
          headers: attemptHeaders(o.headers, trace),
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
      if (!takenOut) failed(p, replica, fault, err);
      if (
        (yielded && !restartable) ||
        attempt > 0 ||
        !(takenOut || retryableFaults.has(fault)) ||
        !anotherUp(p, tried)
      ) {
        rethrow = takenOut ? noneUp(p, err) : err;
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
        p.failovers++;
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
