// The rate-limit windows of the gateway (proto/API.md §9, src/ratelimit): shared by every gateway
// process through Redis when ACS_REDIS_URL is set — answered from this process's memory while
// Redis is down (the documented choice: limits then hold per process; Budgets stay the hard cap)
// — else in this process's memory.
import type { Logger } from "pino";
import type { Config } from "../config/index.js";
import {
  createFailoverRateLimitStore,
  createMemoryRateLimitStore,
  createRedisRateLimitStore,
  type RateLimitStore,
} from "../ratelimit/index.js";

/**
 * The windows for `config`: Redis at `config.redisUrl` (connected first, or within 1 s reported
 * as not answering) with this process's memory as the fallback, or memory alone (then each of
 * ACS_WORKERS' processes counts its own: a warning says so).
 */
export async function openRateLimits(
  config: Pick<Config, "redisUrl" | "workers">,
  logger: Logger,
): Promise<RateLimitStore> {
  const memory = createMemoryRateLimitStore();
  if (config.redisUrl === undefined) {
    if (config.workers > 1) {
      logger.warn(
        { workers: config.workers },
        "rate limits are counted per worker process without ACS_REDIS_URL: a key may get up to ACS_WORKERS times its limit",
      );
    }
    return memory;
  }
  let failing = false;
  const redis = createRedisRateLimitStore({ url: config.redisUrl });
  // Connected before the first request (commands are not queued while connecting: they would fail
  // over to memory); a Redis that does not answer at start is reported, and used once it does.
  await redis.ready().catch((err: unknown) => {
    logger.error(
      { err },
      "Redis of the rate limits does not answer: limits are counted in this process until it does",
    );
  });
  return createFailoverRateLimitStore(redis, memory, {
    onError: (err) => {
      if (failing) return;
      failing = true;
      logger.error(
        { err },
        "Redis of the rate limits does not answer: limits are counted in this process until it does",
      );
      setTimeout(() => {
        failing = false;
      }, 10_000).unref();
    },
  });
}
