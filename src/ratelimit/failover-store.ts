// What the rate limiter does while Redis is down — the documented choice (issue 35): it fails over
// to per-process limits. Each call goes to the primary (Redis) store while it answers; a call it
// rejects (an error, or its short command timeout: nothing waits on a dead Redis) is answered by
// the fallback (this process's memory store) instead, and for `probeEveryMs` after that every call
// goes straight to the fallback; then the next call tries the primary again, and uses it from then
// on if it answers. So a limit holds per process, not across them, while Redis is down (N
// processes may admit up to N × the limit), and for one window after it is back (what the memory
// store admitted is not in Redis). Budgets in the ledger stay the hard cap either way.
//
// correct() and release() go to both stores (an id unknown to one is nothing there); one that the
// primary misses while it is down is lost: its entry keeps the tokens reserved (errs towards
// refusing) until it leaves the window.
import type { RateLimitStore } from "./rate-limit-store.js";

export interface FailoverOptions {
  /** Told each error of the primary (to log and count); the call is answered anyway. */
  readonly onError?: (err: Error, operation: "reserve" | "correct" | "release") => void;
  /** After an error, the primary is skipped for this long (ms of real time, default 1 000). */
  readonly probeEveryMs?: number;
}

/** The primary while it answers, else the fallback; close() closes both. */
export function createFailoverRateLimitStore(
  primary: RateLimitStore,
  fallback: RateLimitStore,
  options: FailoverOptions = {},
): RateLimitStore {
  const probeEveryMs = options.probeEveryMs ?? 1000;
  let skipUntil = 0; // performance.now() before which the primary is not asked
  const usePrimary = () => performance.now() >= skipUntil;
  const failed = (err: unknown, operation: "reserve" | "correct" | "release") => {
    if (err instanceof RangeError) throw err; // the caller's error, not Redis's
    skipUntil = performance.now() + probeEveryMs;
    options.onError?.(err instanceof Error ? err : new Error(String(err)), operation);
  };

  return {
    async reserve(scopes, reservationId, tokens, nowMs) {
      if (usePrimary()) {
        try {
          return await primary.reserve(scopes, reservationId, tokens, nowMs);
        } catch (err) {
          failed(err, "reserve");
        }
      }
      return fallback.reserve(scopes, reservationId, tokens, nowMs);
    },
    async correct(scopes, reservationId, tokens, nowMs) {
      await fallback.correct(scopes, reservationId, tokens, nowMs);
      if (usePrimary())
        await primary.correct(scopes, reservationId, tokens, nowMs).catch((err) => failed(err, "correct"));
    },
    async release(scopes, reservationId, nowMs) {
      await fallback.release(scopes, reservationId, nowMs);
      if (usePrimary())
        await primary.release(scopes, reservationId, nowMs).catch((err) => failed(err, "release"));
    },
    async close() {
      await Promise.all([primary.close(), fallback.close()]);
    },
  };
}
