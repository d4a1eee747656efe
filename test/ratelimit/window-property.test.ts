// The sliding window log, property-tested on both stores against a brute-force oracle: random
// arrivals on a key scope and two key × model scopes, corrections down to usage, releases, on a
// clock that moves by random steps. Each decision equals the oracle's (admitted, retry-after,
// remaining), and at the end no 60-second window, however placed, holds more requests or tokens
// than a scope's limit.
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import type { LimitScope, RateDecision, RateLimits } from "../../src/ratelimit/rate-limit-store.js";
import { rateStoresUnderTest, T0 } from "./helpers.js";

const W = 60_000;

type Op =
  | { kind: "reserve"; dt: number; model: 0 | 1 | 2; tokens: number }
  | { kind: "correct"; dt: number; pick: number; usage: number }
  | { kind: "release"; dt: number; pick: number };

// Steps of exactly 60 s (and 1 ms either side) put arrivals on the instant an entry leaves.
const dt = fc.oneof(
  fc.constant(0),
  fc.integer({ min: 1, max: 2000 }),
  fc.integer({ min: 2000, max: 40_000 }),
  fc.constantFrom(59_999, 60_000, 60_001),
);
// Round amounts (and limits in fifties) make a window hold exactly its limit, often.
const roundTokens = fc.constantFrom(0, 50, 100, 200);
const op: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant("reserve" as const),
      dt,
      model: fc.constantFrom(0, 1, 2) as fc.Arbitrary<0 | 1 | 2>,
      tokens: fc.oneof(fc.integer({ min: 0, max: 400 }), roundTokens),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("correct" as const),
      dt,
      pick: fc.nat(),
      usage: fc.oneof(fc.double({ min: 0, max: 1, noNaN: true }), fc.constantFrom(0, 0.5, 1)),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("release" as const), dt, pick: fc.nat() }) },
);
const limits: fc.Arbitrary<RateLimits> = fc.record(
  {
    requestsPerMinute: fc.integer({ min: 1, max: 8 }),
    tokensPerMinute: fc.integer({ min: 6, max: 30 }).map((n) => n * 50),
  },
  { requiredKeys: [] },
);

interface Entry {
  id: string;
  at: number;
  tokens: number;
  scopes: string[];
  released: boolean;
}

/** The oracle: the entries of `scope` counting at `now`. */
const inWindow = (entries: Entry[], scope: string, now: number) =>
  entries.filter((e) => !e.released && e.scopes.includes(scope) && e.at > now - W);

function fits(entries: Entry[], scopes: LimitScope[], tokens: number, now: number): boolean {
  return scopes.every(({ id, limits: l }) => {
    const live = inWindow(entries, id, now);
    const sum = live.reduce((a, e) => a + e.tokens, 0);
    return (
      live.length + 1 <= (l.requestsPerMinute ?? Infinity) && sum + tokens <= (l.tokensPerMinute ?? Infinity)
    );
  });
}

/** The oracle's retry-after: the first instant the request fits, among the times entries leave. */
function retryAfter(entries: Entry[], scopes: LimitScope[], tokens: number, now: number): number {
  if (scopes.some((s) => tokens > (s.limits.tokensPerMinute ?? Infinity))) return Number.POSITIVE_INFINITY;
  const leaving = [...new Set(entries.filter((e) => e.at > now - W).map((e) => e.at + W - now))].sort(
    (a, b) => a - b,
  );
  return leaving.find((d) => fits(entries, scopes, tokens, now + d)) ?? Number.NaN;
}

function remaining(entries: Entry[], scopes: LimitScope[], now: number, dim: "requests" | "tokens") {
  const values = scopes.flatMap(({ id, limits: l }) => {
    const limit = dim === "requests" ? l.requestsPerMinute : l.tokensPerMinute;
    if (limit === undefined) return [];
    const live = inWindow(entries, id, now);
    return [Math.max(0, limit - (dim === "requests" ? live.length : live.reduce((a, e) => a + e.tokens, 0)))];
  });
  return values.length === 0 ? undefined : Math.min(...values);
}

/** Every window [a, a + W) that starts at an entry's time (the fullest ones) is within the limits. */
function everyWindowWithin(entries: Entry[], scope: LimitScope): void {
  const mine = entries.filter((e) => !e.released && e.scopes.includes(scope.id));
  for (const start of mine) {
    const inIt = mine.filter((e) => e.at >= start.at && e.at < start.at + W);
    expect(inIt.length).toBeLessThanOrEqual(scope.limits.requestsPerMinute ?? Infinity);
    expect(inIt.reduce((a, e) => a + e.tokens, 0)).toBeLessThanOrEqual(
      scope.limits.tokensPerMinute ?? Infinity,
    );
  }
}

describe.each(rateStoresUnderTest())(
  "the sliding window log on $kind, against a brute-force oracle",
  (under) => {
    afterEach(() => under.closeAll());

    it("decides as the oracle and never holds more than a limit in any 60 s window", async (ctx) => {
      const store = await under.open(ctx);
      let run = 0;
      await fc.assert(
        fc.asyncProperty(
          fc.array(limits, { minLength: 3, maxLength: 3 }),
          fc.array(op, { minLength: 30, maxLength: 80 }),
          async (ls, ops) => {
            run++;
            const scopes = [`r${run}:k`, `r${run}:k|m1`, `r${run}:k|m2`].map((id, i) => ({
              id,
              limits: ls[i] as RateLimits,
            }));
            const entries: Entry[] = [];
            let now = T0;
            for (const [i, o] of ops.entries()) {
              now += o.dt;
              if (o.kind === "reserve") {
                const on =
                  o.model === 0
                    ? [scopes[0] as LimitScope]
                    : [scopes[0] as LimitScope, scopes[o.model] as LimitScope];
                const id = `q${i}`;
                const expected = fits(entries, on, o.tokens, now);
                const expectedRetry = expected ? 0 : retryAfter(entries, on, o.tokens, now);
                const d: RateDecision = await store.reserve(on, id, o.tokens, now);
                if (d.admitted)
                  entries.push({
                    id,
                    at: now,
                    tokens: o.tokens,
                    scopes: on.map((s) => s.id),
                    released: false,
                  });
                expect({ admitted: d.admitted, retryAfterMs: d.retryAfterMs }).toEqual({
                  admitted: expected,
                  retryAfterMs: expectedRetry,
                });
                expect(d.requests?.remaining).toBe(remaining(entries, on, now, "requests"));
                expect(d.tokens?.remaining).toBe(remaining(entries, on, now, "tokens"));
              } else if (entries.length > 0) {
                const e = entries[o.pick % entries.length] as Entry;
                const on = scopes.filter((s) => e.scopes.includes(s.id));
                if (o.kind === "release") {
                  await store.release(on, e.id, now);
                  e.released = true;
                } else {
                  const usage = Math.floor(e.tokens * o.usage);
                  await store.correct(on, e.id, usage, now);
                  if (e.at > now - W) e.tokens = usage; // an entry out of the window is not corrected
                }
              }
            }
            for (const s of scopes) everyWindowWithin(entries, s);
          },
        ),
        { numRuns: 40 },
      );
    });
  },
);
