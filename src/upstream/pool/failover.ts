// Failover of one call before output: what may go to another replica, and the loop that sends it.

import type { UpstreamCallTrace } from "../../core/index.js";
import { attemptRequestId } from "../vllm/ids.js";
import type { UpstreamFault } from "../vllm/map-upstream-error.js";
import { upstreamFaultOf } from "../vllm/map-upstream-error.js";
import type { VllmCompletion, VllmCompletionRequest } from "../vllm/types.js";
import type { CompleteOptions, VllmClient } from "../vllm/vllm-client-types.js";
import { attemptSignal } from "./attempt-signal.js";
import {
  anotherCandidate,
  answered,
  type CallWork,
  failed,
  noneUp,
  type PoolState,
  pick,
  type Replica,
} from "./replica-set.js";

const noHeaders: Readonly<Record<string, string>> = Object.freeze({});

/** The headers of an attempt: the caller's, with the attempt's trace headers when it is traced. */
export const attemptHeaders = (
  headers: Readonly<Record<string, string>> | undefined,
  trace: UpstreamCallTrace | undefined,
): Readonly<Record<string, string>> =>
  trace === undefined ? (headers ?? noHeaders) : { ...headers, ...trace.headers };

/**
 * Faults after which a request whose caller has seen nothing may go to another replica: every
 * fault of the replica's (refused, reset, garbage, 503, 5xx, silence).
 */
export const retryableFaults: ReadonlySet<UpstreamFault> = new Set([
  "unreachable",
  "broken",
  "unavailable",
  "rejected",
  "server_error",
  "silent",
]);

export const idempotentRetry = (fault: UpstreamFault) => retryableFaults.has(fault);

/**
 * One call with failover: `call` runs on a chosen replica; when it fails before output with a
 * fault that `mayRetry` allows, it runs once more on another replica (attempt 1). `work` says what
 * the call asks of the replica ({@link pick}).
 */
export async function withFailover<T>(
  p: PoolState,
  caller: AbortSignal | undefined,
  mayRetry: (fault: UpstreamFault, err: unknown) => boolean,
  call: (client: VllmClient, signal: AbortSignal, attempt: number, replica: string) => Promise<T>,
  work: CallWork = "control",
): Promise<T> {
  const tried = new Set<Replica>();
  for (let attempt = 0; ; attempt++) {
    const r = pick(p, tried, work);
    if (r === undefined) throw noneUp(p);
    tried.add(r);
    const link = attemptSignal(r, caller);
    try {
      const result = await call(r.client, link.signal, attempt, r.url);
      answered(p, r, work);
      return result;
    } catch (err) {
      if (caller?.aborted) throw err;
      const takenOut = link.takenOut();
      const fault = takenOut ? "broken" : upstreamFaultOf(err);
      if (!takenOut) failed(p, r, fault, err, work);
      if (attempt > 0 || !(takenOut || mayRetry(fault, err))) throw takenOut ? noneUp(p, err) : err;
      if (!anotherCandidate(p, tried)) throw takenOut ? noneUp(p, err) : err;
      p.failovers++;
    } finally {
      r.outstanding--;
      link.release();
    }
  }
}

/**
 * A pool's `complete`: failed over until the whole answer (the caller sees nothing before it), the
 * caller's deadline shared by the attempts (its signal; a `deadlineMs` too, when set), each
 * attempt traced.
 */
export function poolComplete(
  p: PoolState,
  body: VllmCompletionRequest,
  o: CompleteOptions,
): Promise<VllmCompletion> {
  const start = Date.now();
  return withFailover(
    p,
    o.signal,
    // The caller sees nothing before the whole answer: any fault of the replica's.
    idempotentRetry,
    async (client, signal, attempt, replica) => {
      const upstreamRequestId = attemptRequestId(o.upstreamRequestId, attempt);
      const trace = o.trace?.({ model: p.model, replica, upstreamRequestId, attempt, stream: false });
      try {
        const options: CompleteOptions = {
          signal,
          upstreamRequestId,
          headers: attemptHeaders(o.headers, trace),
        };
        if (o.deadlineMs !== undefined) options.deadlineMs = Math.max(1, o.deadlineMs - (Date.now() - start));
        const result = await client.complete(body, options);
        trace?.end();
        return result;
      } catch (err) {
        trace?.end(err);
        throw err;
      }
    },
    "completion",
  );
}
