// Two Redis stores (two clients, as two gateway processes have) on one Redis share one window:
// of 200 concurrent reserves spread over both, exactly `limit` are admitted; what one admitted the
// other counts, corrects and releases.
import { Redis } from "ioredis";
import { afterEach, describe, expect, it } from "vitest";
import type { LimitScope } from "../../src/ratelimit/rate-limit-store.js";
import { createRedisRateLimitStore, type RedisRateLimitStore } from "../../src/ratelimit/redis-store.js";
import { freshKeyPrefix, REDIS_TEST_URL, redisSkipReason } from "../helpers/redis.js";
import { T0 } from "./helpers.js";

describe("two Redis stores on one Redis", () => {
  let stores: RedisRateLimitStore[] = [];
  let keyPrefix = "";
  afterEach(async () => {
    await Promise.all(stores.map((s) => s.close()));
    stores = [];
  });

  const twoStores = async (ctx: { skip(reason: string): never }) => {
    const reason = await redisSkipReason();
    if (reason !== undefined) ctx.skip(reason);
    keyPrefix = freshKeyPrefix();
    stores = [0, 1].map(() => createRedisRateLimitStore({ url: REDIS_TEST_URL, keyPrefix }));
    await Promise.all(stores.map((s) => s.ready()));
    return stores as [RedisRateLimitStore, RedisRateLimitStore];
  };

  it("admit exactly 60 of 200 concurrent requests on a key limited to 60 per minute", async (ctx) => {
    const [a, b] = await twoStores(ctx);
    const scopes: LimitScope[] = [{ id: "key_1", limits: { requestsPerMinute: 60 } }];
    const decisions = await Promise.all(
      Array.from({ length: 200 }, (_, i) => (i % 2 === 0 ? a : b).reserve(scopes, `r${i}`, 10, T0 + (i % 7))),
    );
    const admitted = decisions.map((d, i) => (d.admitted ? i % 2 : -1)).filter((s) => s >= 0);
    expect(admitted).toHaveLength(60);
    expect(new Set(admitted)).toEqual(new Set([0, 1])); // both processes admitted some
  });

  it("see each other's corrections and releases", async (ctx) => {
    const [a, b] = await twoStores(ctx);
    const scopes: LimitScope[] = [{ id: "key_2", limits: { requestsPerMinute: 2, tokensPerMinute: 100 } }];
    await a.reserve(scopes, "x", 80, T0);
    expect((await b.reserve(scopes, "y", 30, T0 + 1)).admitted).toBe(false);
    await a.correct(scopes, "x", 50, T0 + 2);
    expect((await b.reserve(scopes, "y", 30, T0 + 3)).tokens).toMatchObject({ remaining: 20 });
    expect((await a.reserve(scopes, "z", 0, T0 + 4)).refusedBy).toMatchObject({ dimension: "requests" });
    await b.release(scopes, "x", T0 + 5);
    expect((await a.reserve(scopes, "z", 0, T0 + 6)).admitted).toBe(true);
  });

  it("leave a scope's keys to expire 60 s after its last admitted request", async (ctx) => {
    const [a] = await twoStores(ctx);
    const scopes: LimitScope[] = [{ id: "key_3", limits: { requestsPerMinute: 1 } }];
    await a.reserve(scopes, "x", 5, T0);
    await a.reserve(scopes, "y", 5, T0 + 1); // refused: sets no expiry of its own
    const client = new Redis(REDIS_TEST_URL);
    try {
      for (const suffix of ["z", "a", "n"]) {
        const ttl = await client.pttl(`${keyPrefix}key_3:${suffix}`);
        expect(ttl).toBeGreaterThan(50_000);
        expect(ttl).toBeLessThanOrEqual(60_000);
      }
    } finally {
      client.disconnect();
    }
  });
});
