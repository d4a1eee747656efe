// The rate-limit stores every contract test runs against: the memory store, and the Redis store on
// the shared test Redis (a fresh key prefix per store), skipped with the reason when Redis is
// unreachable (failed instead with ACS_TEST_REDIS=required).
import type { TestContext } from "vitest";
import { createMemoryRateLimitStore } from "../../src/ratelimit/memory-store.js";
import type { RateLimitStore } from "../../src/ratelimit/rate-limit-store.js";
import { createRedisRateLimitStore } from "../../src/ratelimit/redis-store.js";
import { freshKeyPrefix, REDIS_TEST_URL, redisSkipReason } from "../helpers/redis.js";

/** The suite's clock start (Unix epoch ms). */
export const T0 = 1_900_000_000_000;

export interface RateStoreUnderTest {
  readonly kind: "memory" | "redis";
  /** A new, empty store (skips `ctx` when its backend is unavailable); closed by closeAll(). */
  open(ctx: TestContext): Promise<RateLimitStore>;
  closeAll(): Promise<void>;
}

export function rateStoresUnderTest(): RateStoreUnderTest[] {
  const open: RateLimitStore[] = [];
  const closeAll = async () => {
    await Promise.all(open.splice(0).map((s) => s.close()));
  };
  const memory: RateStoreUnderTest = {
    kind: "memory",
    async open() {
      const store = createMemoryRateLimitStore();
      open.push(store);
      return store;
    },
    closeAll,
  };
  const redis: RateStoreUnderTest = {
    kind: "redis",
    async open(ctx) {
      const reason = await redisSkipReason();
      if (reason !== undefined) ctx.skip(reason);
      const store = createRedisRateLimitStore({ url: REDIS_TEST_URL, keyPrefix: freshKeyPrefix() });
      open.push(store);
      await store.ready();
      return store;
    },
    closeAll,
  };
  return [memory, redis];
}
