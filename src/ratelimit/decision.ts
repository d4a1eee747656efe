// The one composition of a decision from each scope's view of its window, shared by both backends
// (the memory store computes the views in TypeScript, the Redis store in its Lua script): which
// limit refused, how long until the request fits, and the tightest scope's headers.
import { type LimitScope, type RateDecision, WINDOW_MS, type WindowState } from "./rate-limit-store.js";

/** One scope's window after the decision (this request's entry in it when admitted). */
export interface ScopeView {
  readonly scope: LimitScope;
  /** Requests in the window. */
  readonly count: number;
  /** Σ tokens of the window's entries. */
  readonly tokens: number;
  /** Time of the window's newest entry (ms), or undefined when it is empty. */
  readonly newestMs: number | undefined;
  /** ms until the request fits this scope's requests limit: 0 when it does, Infinity never. */
  readonly waitRequestsMs: number;
  /** ms until the request fits this scope's tokens limit: 0 when it does, Infinity never. */
  readonly waitTokensMs: number;
}

/** Time until an entry at `entryMs` leaves the window: it counts while now − WINDOW_MS < entryMs. */
export function leavesInMs(entryMs: number, nowMs: number): number {
  return Math.max(0, entryMs + WINDOW_MS - nowMs);
}

type Dimension = "requests" | "tokens";

function tightest(views: readonly ScopeView[], dimension: Dimension, nowMs: number): WindowState | undefined {
  let best: WindowState | undefined;
  for (const view of views) {
    const limit =
      dimension === "requests" ? view.scope.limits.requestsPerMinute : view.scope.limits.tokensPerMinute;
    if (limit === undefined) continue;
    const used = dimension === "requests" ? view.count : view.tokens;
    const remaining = Math.max(0, limit - used);
    if (best !== undefined && best.remaining <= remaining) continue;
    const resetMs = view.newestMs === undefined ? 0 : leavesInMs(view.newestMs, nowMs);
    best = { limit, remaining, resetMs };
  }
  return best;
}

/** The decision the views make: admitted when no scope has to wait. */
export function composeDecision(views: readonly ScopeView[], nowMs: number): RateDecision {
  let retryAfterMs = 0;
  let refusedBy: RateDecision["refusedBy"];
  for (const view of views) {
    for (const dimension of ["requests", "tokens"] as const) {
      const wait = dimension === "requests" ? view.waitRequestsMs : view.waitTokensMs;
      if (wait <= retryAfterMs) continue;
      retryAfterMs = wait;
      const { requestsPerMinute, tokensPerMinute } = view.scope.limits;
      const limit = (dimension === "requests" ? requestsPerMinute : tokensPerMinute) ?? 0;
      refusedBy = { scope: view.scope.id, dimension, limit };
    }
  }
  const decision = {
    admitted: refusedBy === undefined,
    retryAfterMs,
    requests: tightest(views, "requests", nowMs),
    tokens: tightest(views, "tokens", nowMs),
  };
  return refusedBy === undefined ? decision : { ...decision, refusedBy };
}
