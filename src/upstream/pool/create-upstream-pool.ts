import { attemptRequestId } from "../vllm/ids.js";
import type { VllmDetokenizeResponse, VllmModelList, VllmTokenizeResponse } from "../vllm/types.js";
import type { TokenizeResult } from "../vllm/vllm-client-types.js";
import { idempotentRetry, poolComplete, withFailover } from "./failover.js";
import { poolStream } from "./pool-stream.js";
import type { UpstreamPool, UpstreamPoolOptions } from "./pool-types.js";
import { check, poolState } from "./replica-set.js";

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
 *   `failureThreshold` failures in a row of any kind (5xx and silences included) take it out. Only
 *   a completion's answer ends a run that holds a failed completion (and the backoff's doubling):
 *   a replica that answers `/tokenize` and `/health` but not completions is still taken out. A
 *   taken-out replica is checked again after a backoff (doubling from `backoff.initialMs` to
 *   `backoff.maxMs`) and put back when it answers its check; requests on it that had no output yet
 *   are aborted and go to another replica. Panic mode: while none is up, a replica taken out only
 *   for failures in a row still serves, and is put back when it answers a completion (see
 *   `candidates` in replica-set.ts).
 * - Failover, keyed on what reached the caller: a request whose call failed before the caller saw
 *   anything (refused, reset, garbage, 503, another 5xx, silence, a replica that died or was taken
 *   out) goes once to another up replica, with a new upstream request id (an id is never sent
 *   twice to a replica). For `stream` that is before its first chunk is yielded — or, for a caller
 *   that collects the stream before answering (`onRestart` set: a unary call), at any point, the
 *   caller told to drop what it collected; for `complete`, until its whole answer. Never after.
 * - Every replica down: `upstream_unavailable` (503) at once.
 */
export function createUpstreamPool(options: UpstreamPoolOptions): UpstreamPool {
  const p = poolState(options);
  const firstChecks = Promise.all(p.replicas.map((r) => check(p, r))).then(() => undefined);

  return {
    complete: (body, o) => poolComplete(p, body, o),

    stream: (body, o) => poolStream(p, body, o),

    tokenize(servedModel: string, prompt: string, addSpecialTokens: boolean, signal?: AbortSignal) {
      return withFailover<TokenizeResult>(p, signal, idempotentRetry, (client, s) =>
        client.tokenize(servedModel, prompt, addSpecialTokens, s),
      );
    },

    // A caller's control calls: idempotent, so failed over like /tokenize (`<id>-retry` on the second).
    tokenizeText(body, o) {
      return withFailover<VllmTokenizeResponse>(p, o.signal, idempotentRetry, (client, signal, attempt) =>
        client.tokenizeText(body, {
          signal,
          upstreamRequestId: attemptRequestId(o.upstreamRequestId, attempt),
        }),
      );
    },

    detokenize(body, o) {
      return withFailover<VllmDetokenizeResponse>(p, o.signal, idempotentRetry, (client, signal, attempt) =>
        client.detokenize(body, {
          signal,
          upstreamRequestId: attemptRequestId(o.upstreamRequestId, attempt),
        }),
      );
    },

    listModels(signal?: AbortSignal): Promise<VllmModelList> {
      return withFailover(p, signal, idempotentRetry, (client, s) => client.listModels(s));
    },

    async health() {
      return p.replicas.some((r) => r.state === "up");
    },

    serving: () => p.replicas.some((r) => r.state === "up"),

    replicas: () =>
      p.replicas.map((r) => ({
        url: r.url,
        weight: r.weight,
        state: r.state,
        reason: r.reason,
        outstanding: r.outstanding,
        requests: r.requests,
        errors: { ...r.errors },
      })),

    failovers: () => p.failovers,

    ready: () => firstChecks,

    async close() {
      p.closing.abort();
      for (const r of p.replicas) {
        if (r.timer !== undefined) clearTimeout(r.timer);
        r.timer = undefined;
      }
      await Promise.all(p.replicas.map((r) => r.client.close()));
    },
  };
}
