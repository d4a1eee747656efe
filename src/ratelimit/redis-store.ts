// The rate limiter's windows in Redis (rate-limit-store.ts), shared by every gateway process on
// one Redis (a single server or a primary: the scripts touch several scopes' keys, which Redis
// Cluster would refuse across slots). One Lua script per operation (redis-scripts.ts), run by
// EVALSHA through ioredis's defineCommand (EVAL again on NOSCRIPT), so a reserve over several
// scopes is atomic across them and across processes.
//
// A Redis that is down or slow makes calls reject quickly, never wait: no offline queue (a command
// while disconnected fails at once), a command timeout, no resend of unanswered commands after a
// reconnect (a reserve that timed out may have been admitted: its entry then counts, erring
// towards refusing). The client reconnects on its own. failover-store.ts decides what to answer.
import { Redis } from "ioredis";
import { composeDecision, type ScopeView } from "./decision.js";
import { checkArguments, type LimitScope, type RateLimitStore, WINDOW_MS } from "./rate-limit-store.js";
import { CORRECT_LUA, RELEASE_LUA, RESERVE_LUA } from "./redis-scripts.js";

export interface RedisRateLimitOptions {
  /** redis:// or rediss:// URL (ioredis's form: `redis://[:password@]host[:port][/db]`). */
  readonly url: string;
  /** Prefix of every key (default `acs:rl:`); a scope's keys are `<prefix><scope id>:z|:a|:n`. */
  readonly keyPrefix?: string;
  /** A command not answered within this is rejected (ms, default 250). */
  readonly commandTimeoutMs?: number;
  /** A connection attempt not made within this fails (ms, default 1 000); retried every ≤ 1 s. */
  readonly connectTimeoutMs?: number;
}

/** The Redis store, with `ready()`: resolves once connected (rejects after connectTimeoutMs). */
export interface RedisRateLimitStore extends RateLimitStore {
  ready(): Promise<void>;
}

type Arg = string | number;
interface ScriptCommands {
  rlReserve(keys: number, ...args: Arg[]): Promise<number[]>;
  rlCorrect(keys: number, ...args: Arg[]): Promise<number>;
  rlRelease(keys: number, ...args: Arg[]): Promise<number>;
}

function keysOf(scopes: readonly LimitScope[]): string[] {
  return scopes.flatMap((s) => [`${s.id}:z`, `${s.id}:a`, `${s.id}:n`]);
}

function limitArgs(scopes: readonly LimitScope[]): number[] {
  return scopes.flatMap((s) => [s.limits.requestsPerMinute ?? 0, s.limits.tokensPerMinute ?? 0]);
}

const fromLua = (ms: number) => (ms === -1 ? Number.POSITIVE_INFINITY : ms);

function viewsOf(scopes: readonly LimitScope[], reply: number[]): ScopeView[] {
  return scopes.map((scope, i) => {
    const [count, tokens, newest, waitRequests, waitTokens] = reply.slice(1 + 5 * i, 6 + 5 * i) as number[];
    return {
      scope,
      count: count as number,
      tokens: tokens as number,
      newestMs: newest === -1 ? undefined : newest,
      waitRequestsMs: fromLua(waitRequests as number),
      waitTokensMs: fromLua(waitTokens as number),
    };
  });
}

/** A RateLimitStore on the Redis at `url`; connects at once, in the background. */
export function createRedisRateLimitStore(options: RedisRateLimitOptions): RedisRateLimitStore {
  const connectTimeout = options.connectTimeoutMs ?? 1000;
  const client = new Redis(options.url, {
    keyPrefix: options.keyPrefix ?? "acs:rl:",
    commandTimeout: options.commandTimeoutMs ?? 250,
    connectTimeout,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
    maxRetriesPerRequest: 0,
    retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 1000),
  });
  client.on("error", () => undefined); // each call rejects with its own error
  client.defineCommand("rlReserve", { lua: RESERVE_LUA });
  client.defineCommand("rlCorrect", { lua: CORRECT_LUA });
  client.defineCommand("rlRelease", { lua: RELEASE_LUA });
  const scripts = client as unknown as ScriptCommands;
  const common = (scopes: readonly LimitScope[], id: string, now: number): Arg[] => [
    scopes.length * 3,
    ...keysOf(scopes),
    id,
    now,
    WINDOW_MS,
  ];

  return {
    async reserve(scopes, reservationId, tokens, nowMs) {
      const now = checkArguments(scopes, tokens, nowMs);
      const [keys, ...args] = common(scopes, reservationId, now) as [number, ...Arg[]];
      const reply = await scripts
        .rlReserve(keys, ...args, tokens, ...limitArgs(scopes))
        .catch((err: Error) => {
          throw err.message.includes("is already in a window") ? new RangeError(err.message) : err;
        });
      return composeDecision(viewsOf(scopes, reply), now);
    },
    async correct(scopes, reservationId, tokens, nowMs) {
      const now = checkArguments(scopes, tokens, nowMs);
      const [keys, ...args] = common(scopes, reservationId, now) as [number, ...Arg[]];
      await scripts.rlCorrect(keys, ...args, tokens);
    },
    async release(scopes, reservationId, nowMs) {
      const now = checkArguments(scopes, 0, nowMs);
      const [keys, ...args] = common(scopes, reservationId, now) as [number, ...Arg[]];
      await scripts.rlRelease(keys, ...args);
    },
    ready() {
      if (client.status === "ready") return Promise.resolve();
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => done(new Error(`Redis not ready within ${connectTimeout} ms`)),
          connectTimeout,
        );
        const done = (err?: Error) => {
          clearTimeout(timer);
          client.off("ready", onReady);
          if (err) reject(err);
          else resolve();
        };
        const onReady = () => done();
        client.on("ready", onReady);
      });
    },
    async close() {
      await client.quit().catch(() => client.disconnect());
    },
  };
}
