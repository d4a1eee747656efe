// Servers as child processes on loopback, for tests and benchmarks that need real processes.
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { HANG_GUARD_MS } from "./hang-guard.js";

/** A TCP port on 127.0.0.1 that was free a moment ago. */
export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Polls `url` every `intervalMs` until it answers 2xx; throws after `timeoutMs` (a hang guard). */
export async function waitForOk(url: string, timeoutMs = HANG_GUARD_MS, intervalMs = 100): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`${url} did not come up within ${timeoutMs} ms`);
}

/**
 * Runs a TypeScript entry point as one node process with tsx's loader (no wrapper process, so a
 * signal reaches the server itself), with `env` added to this process's environment. The gateway
 * runs as one process (`ACS_WORKERS=1`) unless `env` says otherwise: tests read its pid and logs.
 */
export function startTs(args: string[], env: Record<string, string>): ChildProcess {
  return spawn(process.execPath, ["--import", "tsx", ...args], {
    env: { ...process.env, ACS_WORKERS: "1", ...env },
    stdio: "ignore",
  });
}
