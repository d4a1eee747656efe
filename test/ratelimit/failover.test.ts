// Redis down (src/ratelimit/failover-store.ts): on a private redis-server that the test kills,
// pauses (SIGSTOP: connected but silent) and starts again, the failover store keeps answering from
// memory, every call within a bounded time, and uses Redis again once it answers.
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFailoverRateLimitStore } from "../../src/ratelimit/failover-store.js";
import { createMemoryRateLimitStore } from "../../src/ratelimit/memory-store.js";
import type { LimitScope, RateLimitStore } from "../../src/ratelimit/rate-limit-store.js";
import { createRedisRateLimitStore } from "../../src/ratelimit/redis-store.js";
import { type PrivateRedis, startPrivateRedis } from "../helpers/redis.js";
import { T0 } from "./helpers.js";

/** Longer than one command timeout (200 ms) and a reconnect, shorter than any hang. */
const BOUND_MS = 1000;

describe("the failover store while Redis is down", () => {
  let redis: PrivateRedis | undefined;
  let skipReason: string | undefined;
  beforeAll(async () => {
    const started = await startPrivateRedis();
    if ("skipReason" in started) skipReason = started.skipReason;
    else redis = started;
  });
  afterAll(() => redis?.remove());

  /** Entries Redis holds for `scope` (a client of the test's own). */
  const inRedis = async (scope: string) => {
    const client = new Redis((redis as PrivateRedis).url, { keyPrefix: "t:" });
    try {
      return await client.zcard(`${scope}:z`);
    } finally {
      client.disconnect();
    }
  };

  /** Runs `fn`, failing when it does not settle within BOUND_MS (a hang fails fast, not at the guard). */
  const bounded = async <T>(fn: () => Promise<T>): Promise<T> => {
    let timer: NodeJS.Timeout | undefined;
    const hung = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${BOUND_MS} ms`)), BOUND_MS);
    });
    try {
      return await Promise.race([fn(), hung]);
    } finally {
      clearTimeout(timer);
    }
  };

  it("answers from memory while Redis is killed or silent, and from Redis again once it is back", async (ctx) => {
    if (redis === undefined) return ctx.skip(skipReason ?? "no private Redis");
    const primary = createRedisRateLimitStore({ url: redis.url, keyPrefix: "t:", commandTimeoutMs: 200 });
    await primary.ready();
    const errors: string[] = [];
    const messages: string[] = [];
    const store: RateLimitStore = createFailoverRateLimitStore(primary, createMemoryRateLimitStore(), {
      probeEveryMs: 100,
      onError: (err, operation) => {
        errors.push(operation);
        messages.push(err.message);
      },
    });
    const scopes: LimitScope[] = [{ id: "k", limits: { requestsPerMinute: 3 } }];
    try {
      expect((await store.reserve(scopes, "a", 1, T0)).requests).toMatchObject({ remaining: 2 });
      expect(await inRedis("k")).toBe(1);

      await redis.kill();
      const down = await bounded(() => store.reserve(scopes, "b", 1, T0 + 1));
      expect(down).toMatchObject({ admitted: true, requests: { remaining: 2 } }); // memory's own window
      expect(errors).toEqual(["reserve"]);
      // Refused at once, not after the command timeout: no offline queue holds it.
      expect(messages[0]).not.toMatch(/timed out/i);
      for (let i = 0; i < 3; i++) await bounded(() => store.reserve(scopes, `c${i}`, 1, T0 + 2));
      expect((await bounded(() => store.reserve(scopes, "d", 1, T0 + 3))).admitted).toBe(false); // memory's limit holds
      await bounded(() => store.release(scopes, "c0", T0 + 4));

      await redis.start();
      await waitFor(async () => {
        await bounded(() => store.reserve(scopes, `e${performance.now()}`, 1, T0 + 5));
        return (await inRedis("k")) > 0;
      });

      redis.pause();
      const before = errors.length;
      const silent = await bounded(() => store.reserve(scopes, "f", 1, T0 + 6));
      expect(errors.length).toBe(before + 1); // the command timed out; memory answered
      expect(messages.at(-1)).toMatch(/timed out/i);
      expect(silent.requests).toBeDefined();
      redis.resume();
      await waitFor(async () => {
        const id = `g${performance.now()}`;
        await bounded(() => store.reserve([{ id: "k2", limits: {} }], id, 1, T0 + 7));
        return (await inRedis("k2")) > 0;
      });
    } finally {
      redis.resume();
      await store.close();
    }
  });
});

/** Polls `check` every 100 ms until it is true, for at most 5 s. */
async function waitFor(check: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 50; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("not within 5 s");
}
