// The one link between the process-long shutdown signal and the calls it cancels (REST and RPC).

import type { CallRecord } from "./call-record.js";
import { ApiError } from "./errors/index.js";

/**
 * The calls a process-long shutdown signal cancels, through **one** `abort` listener on it however
 * many calls are open: each call's AbortController is in a set from the call's start until its
 * response closes, and nothing of a call stays behind after that.
 *
 * Why not per call: `AbortSignal.any([call, shutdown])` keeps ~64 B per call on the long-lived
 * signal forever on Node 20 (nodejs/node#55351: +19 MB of heap over 300,000 requests); and a
 * listener per call on one EventTarget costs O(open calls) per `addEventListener` (Node walks its
 * listener list), which is quadratic under load.
 */
export interface ShutdownLink {
  /** The process-long signal (aborted once, when the server starts closing). */
  readonly signal: AbortSignal;
  /** Calls tied to the signal now: those whose response has not closed yet. */
  readonly openCalls: number;
  /**
   * Aborts `controller` with the shutdown signal's reason when it aborts (at once if it already
   * has); returns the function that unties them (idempotent).
   */
  tie(controller: AbortController): () => void;
  /**
   * The error a call's caller is shown for `err`: when the signal has aborted with an ApiError
   * (the lifecycle's 503 `upstream_unavailable`) and `err` is the `canceled` ApiError that abort
   * caused in the service, that reason, and `record` (the access line and the metrics) gets its
   * code; else `err` itself. REST's error handler and the Connect routes both ask it.
   */
  shown(err: unknown, record?: CallRecord): unknown;
}

/** A {@link ShutdownLink} over `shutdown`: adds its one `abort` listener now. */
export function createShutdownLink(shutdown: AbortSignal): ShutdownLink {
  const calls = new Set<AbortController>();
  shutdown.addEventListener(
    "abort",
    () => {
      for (const controller of calls) controller.abort(shutdown.reason);
      calls.clear();
    },
    { once: true },
  );
  return {
    signal: shutdown,
    get openCalls() {
      return calls.size;
    },
    tie(controller) {
      if (shutdown.aborted) {
        controller.abort(shutdown.reason);
        return () => {};
      }
      calls.add(controller);
      return () => {
        calls.delete(controller);
      };
    },
    shown(err, record) {
      const reason: unknown = shutdown.aborted ? shutdown.reason : undefined;
      if (!(reason instanceof ApiError && err instanceof ApiError && err.code === "canceled")) return err;
      if (record !== undefined) record.errorCode = reason.code;
      return reason;
    },
  };
}
