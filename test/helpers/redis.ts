// Redis for tests: the machine's real server (127.0.0.1:6379, or ACS_TEST_REDIS_URL), a fresh key
// prefix per test; and a private redis-server of one test file, to kill and start again (outage
// tests). Without a server (or the redis-server binary) the Redis tests are skipped with the
// reason — unless ACS_TEST_REDIS=required (.ci/run sets it), which makes them fail instead.
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createServer } from "node:net";
import { Redis } from "ioredis";

/** The shared server the tests use. */
export const REDIS_TEST_URL = process.env.ACS_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";

/** Set by .ci/run: a missing Redis fails the run instead of skipping its tests. */
export const REDIS_REQUIRED = process.env.ACS_TEST_REDIS === "required";

/** PING the Redis at `url`: undefined when it answers, else why not. */
async function ping(url: string): Promise<string | undefined> {
  const client = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 2000,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  let cause: string | undefined; // the socket's error (ECONNREFUSED…), clearer than "Connection is closed"
  client.on("error", (err: Error) => {
    cause ??= err.message;
  });
  try {
    await client.connect();
    await client.ping();
    return undefined;
  } catch (err) {
    return `Redis is unreachable at ${url.replace(/\/\/[^@]*@/, "//***@")} (${cause ?? (err as Error).message})`;
  } finally {
    client.disconnect();
  }
}

let probe: Promise<string | undefined> | undefined;

/**
 * Undefined when the shared Redis answers; else the reason to skip (one probe per process).
 * Throws when it does not answer and ACS_TEST_REDIS=required.
 */
export async function redisSkipReason(): Promise<string | undefined> {
  probe ??= ping(REDIS_TEST_URL);
  const reason = await probe;
  if (reason === undefined) return undefined;
  if (REDIS_REQUIRED) throw new Error(`${reason}; ACS_TEST_REDIS=required`);
  return `${reason}: Redis tests skipped`;
}

/** A key prefix no other test uses: `acs-test:<hex>:`. */
export function freshKeyPrefix(): string {
  return `acs-test:${randomBytes(6).toString("hex")}:`;
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A private redis-server (no persistence) on a free loopback port. */
export interface PrivateRedis {
  readonly url: string;
  /** SIGKILL: connections drop, new ones are refused until start(). */
  kill(): Promise<void>;
  /** SIGSTOP / SIGCONT: the server holds its connections but answers nothing until resumed. */
  pause(): void;
  resume(): void;
  /** Starts it again on the same port, empty. */
  start(): Promise<void>;
  /** Kills it (if running). */
  remove(): Promise<void>;
}

/** Starts a private redis-server, or returns why it cannot (the caller skips, or fails when required). */
export async function startPrivateRedis(): Promise<PrivateRedis | { skipReason: string }> {
  const port = await freePort();
  const url = `redis://127.0.0.1:${port}`;
  let child: ChildProcess | undefined;
  const start = async () => {
    const proc = spawn(
      "redis-server",
      ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
      {
        stdio: "ignore",
      },
    );
    const failed = new Promise<string>((resolve) => {
      proc.once("error", (err) => resolve(err.message));
      proc.once("exit", (code) => resolve(`redis-server exited with ${code}`));
    });
    child = proc;
    for (let i = 0; i < 100; i++) {
      const early = await Promise.race([failed, new Promise<undefined>((r) => setTimeout(r, 50, undefined))]);
      if (early !== undefined) throw new Error(early);
      if ((await ping(url)) === undefined) return;
    }
    throw new Error(`redis-server did not answer on port ${port} within 5 s`);
  };
  const kill = async () => {
    const proc = child;
    child = undefined;
    if (proc === undefined || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise((resolve) => proc.once("exit", resolve));
    proc.kill("SIGCONT");
    proc.kill("SIGKILL");
    await exited;
  };
  try {
    await start();
  } catch (err) {
    await kill();
    const reason = `a private redis-server cannot be started (${(err as Error).message})`;
    if (REDIS_REQUIRED) throw new Error(`${reason}; ACS_TEST_REDIS=required`);
    return { skipReason: `${reason}: the Redis outage test is skipped` };
  }
  return {
    url,
    kill,
    pause: () => child?.kill("SIGSTOP"),
    resume: () => child?.kill("SIGCONT"),
    start,
    remove: kill,
  };
}
