// The rate limiter's windows in one process's memory (rate-limit-store.ts): a sliding window log
// per scope (memory-window.ts). JavaScript runs one call at a time, so a reserve over several
// scopes is atomic by construction.
//
// Bound: only scopes with a reserve in the last 60 s are kept (a scope idle for WINDOW_MS is
// empty and dropped, oldest first, at each reserve), each holding the entries of its last 60 s:
// memory grows with the requests admitted per minute × their scopes, and at most `maxScopes`
// scopes (default 100 000) — past it the least recently reserved scope is forgotten (its window
// starts empty again: the limiter errs towards admitting).
import { composeDecision, type ScopeView } from "./decision.js";
import { MemoryWindow } from "./memory-window.js";
import { checkArguments, type LimitScope, type RateLimitStore, WINDOW_MS } from "./rate-limit-store.js";

export interface MemoryRateLimitOptions {
  /** Scopes kept at most (default 100 000). */
  readonly maxScopes?: number;
}

/** The memory store, with the number of scopes it holds (the bound above). */
export interface MemoryRateLimitStore extends RateLimitStore {
  scopeCount(): number;
}

/** A RateLimitStore in this process's memory; close() empties it. */
export function createMemoryRateLimitStore(options: MemoryRateLimitOptions = {}): MemoryRateLimitStore {
  const maxScopes = options.maxScopes ?? 100_000;
  // Least recently reserved first: a reserve moves its scopes to the end.
  const windows = new Map<string, MemoryWindow>();

  const sweep = (nowMs: number) => {
    for (const [id, window] of windows) {
      if (windows.size <= maxScopes && window.lastReserveMs > nowMs - WINDOW_MS) break;
      windows.delete(id);
    }
  };
  const existing = (scopes: readonly LimitScope[], nowMs: number) => {
    const found: MemoryWindow[] = [];
    for (const scope of scopes) {
      const window = windows.get(scope.id);
      if (window === undefined) continue;
      window.expire(nowMs);
      found.push(window);
    }
    return found;
  };

  return {
    async reserve(scopes, reservationId, tokens, nowMs) {
      const now = checkArguments(scopes, tokens, nowMs);
      const ws = scopes.map((scope) => {
        const window = windows.get(scope.id) ?? new MemoryWindow();
        window.expire(now);
        if (window.has(reservationId))
          throw new RangeError(`reservation ${reservationId} is already in ${scope.id}`);
        return window;
      });
      const view = (i: number, admitted: boolean): ScopeView => {
        const scope = scopes[i] as LimitScope;
        const w = ws[i] as MemoryWindow;
        return {
          scope,
          count: w.count,
          tokens: w.tokens,
          newestMs: w.newestMs(),
          waitRequestsMs: admitted ? 0 : w.waitRequests(scope.limits.requestsPerMinute, now),
          waitTokensMs: admitted ? 0 : w.waitTokens(scope.limits.tokensPerMinute, tokens, now),
        };
      };
      const before = composeDecision(
        scopes.map((_, i) => view(i, false)),
        now,
      );
      if (!before.admitted) return before;
      scopes.forEach((scope, i) => {
        const w = ws[i] as MemoryWindow;
        w.add(reservationId, tokens, now);
        windows.delete(scope.id);
        windows.set(scope.id, w);
      });
      sweep(now);
      return composeDecision(
        scopes.map((_, i) => view(i, true)),
        now,
      );
    },
    async correct(scopes, reservationId, tokens, nowMs) {
      const now = checkArguments(scopes, tokens, nowMs);
      for (const window of existing(scopes, now)) window.correct(reservationId, tokens);
    },
    async release(scopes, reservationId, nowMs) {
      const now = checkArguments(scopes, 0, nowMs);
      for (const window of existing(scopes, now)) window.release(reservationId);
    },
    scopeCount: () => windows.size,
    async close() {
      windows.clear();
    },
  };
}
