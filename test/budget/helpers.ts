import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The repository root (cwd of child processes). */
export const ROOT = fileURLToPath(new URL("../../", import.meta.url));

/** A fresh temp dir with a path for a SQLite file in it; `cleanup` removes the dir. */
export function tempDb(): { dir: string; path: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "acs-budget-"));
  return { dir, path: join(dir, "budget.db"), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Starts a TypeScript fixture in a real child process (node --import tsx). */
export function spawnFixture(file: string, args: readonly string[]): ChildProcess {
  return spawn(process.execPath, ["--import", "tsx", join(ROOT, "test/budget/fixtures", file), ...args], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
}

/**
 * Reads `child`'s stdout line by line: each call of the returned function resolves with the next
 * line, or rejects when the child exits first (with its stderr in the message).
 */
export function lineReader(child: ChildProcess): () => Promise<string> {
  const lines: string[] = [];
  const waiters: { resolve: (line: string) => void; reject: (err: Error) => void }[] = [];
  let stderr = "";
  let ended: Error | undefined;
  createInterface({ input: child.stdout! }).on("line", (line) => {
    const waiter = waiters.shift();
    if (waiter === undefined) lines.push(line);
    else waiter.resolve(line);
  });
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString("utf8");
  });
  child.on("close", (code, signal) => {
    ended = new Error(`child exited (${code ?? signal}); stderr: ${stderr}`);
    for (const waiter of waiters.splice(0)) waiter.reject(ended);
  });
  return () => {
    const line = lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    if (ended !== undefined) return Promise.reject(ended);
    return new Promise((resolve, reject) => waiters.push({ resolve, reject }));
  };
}

/** Resolves when `child` has exited, with its code and signal. */
export function exited(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  }
  return new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
}
