// The rate limiter's public surface (README.md beside this file): the interface, the three stores
// and OpenAI's headers.
export { createFailoverRateLimitStore, type FailoverOptions } from "./failover-store.js";
export { formatResetDuration, rateLimitHeaders } from "./headers.js";
export {
  createMemoryRateLimitStore,
  type MemoryRateLimitOptions,
  type MemoryRateLimitStore,
} from "./memory-store.js";
export {
  type LimitScope,
  MAX_AMOUNT,
  type RateDecision,
  type RateLimitStore,
  type RateLimits,
  WINDOW_MS,
  type WindowState,
} from "./rate-limit-store.js";
export {
  createRedisRateLimitStore,
  type RedisRateLimitOptions,
  type RedisRateLimitStore,
} from "./redis-store.js";
