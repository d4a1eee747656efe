// The RateLimitStore contract (src/ratelimit/rate-limit-store.ts), one suite that both stores pass:
// the memory store and the Redis store give the same decisions, numbers and refusals, on a clock
// the test controls.
import { afterEach, describe, expect, it } from "vitest";
import type { LimitScope, RateLimitStore } from "../../src/ratelimit/rate-limit-store.js";
import { rateStoresUnderTest, T0 } from "./helpers.js";

const scope = (id: string, requestsPerMinute?: number, tokensPerMinute?: number): LimitScope => ({
  id,
  limits: {
    ...(requestsPerMinute === undefined ? {} : { requestsPerMinute }),
    ...(tokensPerMinute === undefined ? {} : { tokensPerMinute }),
  },
});

describe.each(rateStoresUnderTest())("the RateLimitStore contract on $kind", (under) => {
  let store: RateLimitStore;
  afterEach(() => under.closeAll());
  const open = async (ctx: Parameters<typeof under.open>[0]) => {
    store = await under.open(ctx);
  };

  it("admits exactly `limit` of 200 concurrent reserves, per dimension", async (ctx) => {
    await open(ctx);
    const byRequests = [scope("k1", 60)];
    const byTokens = [scope("k2", undefined, 1000)];
    const all = await Promise.all(
      Array.from({ length: 200 }, (_, i) => [
        store.reserve(byRequests, `r${i}`, 5, T0),
        store.reserve(byTokens, `t${i}`, 7, T0),
      ]).flat(),
    );
    const admitted = (prefix: number) => all.filter((d, i) => i % 2 === prefix && d.admitted).length;
    expect(admitted(0)).toBe(60);
    expect(admitted(1)).toBe(Math.floor(1000 / 7));
  });

  it("an entry leaves the window 60 s after it was admitted, exactly", async (ctx) => {
    await open(ctx);
    const s = [scope("k", 1, 100)];
    expect((await store.reserve(s, "a", 30, T0)).admitted).toBe(true);
    const early = await store.reserve(s, "b", 10, T0 + 59_999);
    expect(early).toMatchObject({ admitted: false, retryAfterMs: 1, tokens: { remaining: 70 } });
    const onTime = await store.reserve(s, "c", 10, T0 + 60_000);
    expect(onTime).toMatchObject({ admitted: true, retryAfterMs: 0 });
    expect(onTime.requests).toEqual({ limit: 1, remaining: 0, resetMs: 60_000 });
    expect(onTime.tokens).toEqual({ limit: 100, remaining: 90, resetMs: 60_000 }); // a's 30 have left
  });

  it("gives remaining, reset and retry-after from the window's entries", async (ctx) => {
    await open(ctx);
    const s = [scope("k", 3, 100)];
    await store.reserve(s, "a", 10, T0);
    await store.reserve(s, "b", 20, T0 + 1000);
    const third = await store.reserve(s, "c", 30, T0 + 2000);
    expect(third).toEqual({
      admitted: true,
      retryAfterMs: 0,
      requests: { limit: 3, remaining: 0, resetMs: 60_000 },
      tokens: { limit: 100, remaining: 40, resetMs: 60_000 },
    });
    // 65 more tokens need 25 freed: a (10) at T0 + 60 s is not enough, b (20) at T0 + 61 s is.
    const refused = await store.reserve(s, "d", 65, T0 + 5000);
    expect(refused).toEqual({
      admitted: false,
      retryAfterMs: 56_000,
      requests: { limit: 3, remaining: 0, resetMs: 57_000 },
      tokens: { limit: 100, remaining: 40, resetMs: 57_000 },
      refusedBy: { scope: "k", dimension: "tokens", limit: 100 },
    });
    const byRequests = await store.reserve(s, "e", 1, T0 + 5000);
    expect(byRequests).toMatchObject({
      retryAfterMs: 55_000,
      refusedBy: { dimension: "requests", limit: 3 },
    });
    expect((await store.reserve(s, "f", 65, T0 + 60_999)).admitted).toBe(false);
    expect((await store.reserve(s, "g", 65, T0 + 61_000)).admitted).toBe(true);
  });

  it("waits for the entry whose leaving frees exactly enough tokens", async (ctx) => {
    await open(ctx);
    const s = [scope("t", undefined, 100)];
    await store.reserve(s, "a", 10, T0);
    await store.reserve(s, "b", 20, T0 + 1000);
    await store.reserve(s, "c", 30, T0 + 2000);
    expect((await store.reserve(s, "d", 50, T0 + 5000)).retryAfterMs).toBe(55_000); // a's 10 are enough
    expect((await store.reserve(s, "e", 51, T0 + 5000)).retryAfterMs).toBe(56_000); // b's too
    expect((await store.reserve(s, "f", 40, T0 + 5000)).admitted).toBe(true); // exactly the limit
  });

  it("shows the tightest scope per dimension, and nothing for a dimension no scope limits", async (ctx) => {
    await open(ctx);
    const d = await store.reserve([scope("k", 10, 50), scope("k|m", 3, 500)], "a", 20, T0);
    expect(d.requests).toEqual({ limit: 3, remaining: 2, resetMs: 60_000 });
    expect(d.tokens).toEqual({ limit: 50, remaining: 30, resetMs: 60_000 });
    const free = await store.reserve([scope("other")], "a", 1_000_000, T0);
    expect(free).toEqual({ admitted: true, retryAfterMs: 0, requests: undefined, tokens: undefined });
  });

  it("never fits a request of more tokens than the limit: retryAfterMs is Infinity", async (ctx) => {
    await open(ctx);
    const d = await store.reserve([scope("k", 10, 100)], "a", 101, T0);
    expect(d).toMatchObject({ admitted: false, retryAfterMs: Number.POSITIVE_INFINITY });
    expect(d.refusedBy).toEqual({ scope: "k", dimension: "tokens", limit: 100 });
    expect(d.tokens).toEqual({ limit: 100, remaining: 100, resetMs: 0 });
  });

  it("is atomic across scopes: a request refused by key × model leaves nothing in the key scope", async (ctx) => {
    await open(ctx);
    const key = scope("k", 10, 1000);
    expect((await store.reserve([key, scope("k|m", 1)], "a", 100, T0)).admitted).toBe(true);
    const refused = await store.reserve([key, scope("k|m", 1)], "b", 100, T0 + 1);
    expect(refused.refusedBy).toEqual({ scope: "k|m", dimension: "requests", limit: 1 });
    const other = await store.reserve([key, scope("k|n", 5)], "c", 100, T0 + 2);
    expect(other.tokens).toEqual({ limit: 1000, remaining: 800, resetMs: 60_000 });
    expect(other.requests).toEqual({ limit: 5, remaining: 4, resetMs: 60_000 });
    const keyOnly = await store.reserve([key], "d", 0, T0 + 3);
    expect(keyOnly.requests).toMatchObject({ limit: 10, remaining: 7 });
  });

  it("correct() sets a reservation's tokens, up or down, idempotently; unknown and expired ids are nothing", async (ctx) => {
    await open(ctx);
    const s = [scope("k", undefined, 1000)];
    await store.reserve(s, "a", 600, T0);
    await store.correct(s, "a", 100, T0 + 10);
    await store.correct(s, "a", 100, T0 + 20);
    await store.correct(s, "nobody", 5, T0 + 20);
    const b = await store.reserve(s, "b", 900, T0 + 30);
    expect(b).toMatchObject({ admitted: true, tokens: { remaining: 0 } });
    await store.correct(s, "b", 950, T0 + 40); // above what it reserved: the window is over its limit
    const c = await store.reserve(s, "c", 0, T0 + 50);
    expect(c).toMatchObject({ admitted: false, retryAfterMs: 60_000 - 50, tokens: { remaining: 0 } });
    await store.correct(s, "b", 100, T0 + 60);
    expect((await store.reserve(s, "d", 800, T0 + 70)).tokens).toMatchObject({ remaining: 0 });
    await store.correct(s, "a", 1000, T0 + 60_000); // a has left the window: nothing
    expect((await store.reserve(s, "e", 100, T0 + 60_000)).tokens).toMatchObject({ remaining: 0 });
  });

  it("release() removes a reservation entirely, idempotently", async (ctx) => {
    await open(ctx);
    const s = [scope("k", 2, 100), scope("k|m", 2)];
    await store.reserve(s, "a", 40, T0);
    await store.reserve(s, "b", 40, T0 + 1);
    expect((await store.reserve(s, "c", 10, T0 + 2)).admitted).toBe(false);
    await store.release(s, "a", T0 + 3);
    await store.release(s, "a", T0 + 4);
    await store.release(s, "nobody", T0 + 4);
    const c = await store.reserve(s, "c", 10, T0 + 5);
    expect(c).toMatchObject({ admitted: true, requests: { remaining: 0 }, tokens: { remaining: 50 } });
    // The window's oldest entry is now b (T0 + 1): a refusal waits for it, not for a.
    expect((await store.reserve(s, "d", 0, T0 + 6)).retryAfterMs).toBe(60_000 - 5);
  });

  it("refuses a reservation id already in a window, and invalid arguments, with a RangeError", async (ctx) => {
    await open(ctx);
    await store.reserve([scope("k", 5)], "a", 1, T0);
    await expect(store.reserve([scope("j"), scope("k", 5)], "a", 1, T0)).rejects.toThrow(RangeError);
    expect((await store.reserve([scope("j", 1)], "x", 1, T0)).admitted).toBe(true); // j kept nothing of "a"
    await expect(store.reserve([scope("k", 0)], "b", 1, T0)).rejects.toThrow(RangeError);
    await expect(store.reserve([scope("k", 1.5)], "b", 1, T0)).rejects.toThrow(RangeError);
    await expect(store.reserve([scope("k")], "b", -1, T0)).rejects.toThrow(RangeError);
    await expect(store.reserve([scope("k")], "b", 1e12 + 1, T0)).rejects.toThrow(RangeError);
    await expect(store.reserve([scope("k"), scope("k")], "b", 1, T0)).rejects.toThrow(RangeError);
    await expect(store.correct([scope("k")], "a", Number.NaN, T0)).rejects.toThrow(RangeError);
  });
});
