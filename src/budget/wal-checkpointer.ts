import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/** How often the checkpointer copies the WAL's committed pages into the database file, ms. */
export const DEFAULT_CHECKPOINT_INTERVAL_MS = 100;

/** Checkpoint passes in a row at most, each copying what was committed during the one before. */
const MAX_PASSES = 8;

/** A running {@link startWalCheckpointer}. */
export interface WalCheckpointer {
  /** Stops the checkpoints and closes the worker's connection; resolves once the worker exited. */
  close(): Promise<void>;
}

// The worker's code, CommonJS (an `eval` worker): one connection of its own to the file, and a
// PASSIVE checkpoint every `intervalMs` — it copies what no reader still needs and never waits
// for (or blocks) a writer. `close` stops the timer and closes the connection; the worker then
// has nothing left to run and exits.
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const Database = require(workerData.betterSqlite3);
const db = new Database(workerData.path);
let timer;
const run = () => {
  try {
    // Passes until one finds every frame copied (or maxPasses): then the next write
    // starts the WAL over from its beginning, and the file stops growing. Each pass copies only
    // what was committed during the one before.
    for (let pass = 0; pass < workerData.maxPasses; pass++) {
      const [r] = db.pragma("wal_checkpoint(PASSIVE)");
      if (r === undefined || r.busy !== 0 || r.log === r.checkpointed) break;
    }
  } catch (err) {
    parentPort.postMessage({ failed: String(err && err.message ? err.message : err) });
    return;
  }
  timer = setTimeout(run, workerData.intervalMs);
};
timer = setTimeout(run, workerData.intervalMs);
parentPort.on("message", (m) => {
  if (m !== "close") return;
  clearTimeout(timer);
  db.close();
  parentPort.close();
});
`;

/**
 * Runs the WAL checkpoints of the SQLite file at `path` on a worker thread, so that the
 * request path never pays for them: a checkpoint copies the WAL's pages into the database file and
 * fsyncs both, which on the main thread (SQLite's automatic checkpoint, every 1,000 pages) stalled
 * one Hold in a few hundred for several milliseconds. The caller moves the automatic checkpoint
 * of its own connection far apart (a safety net: only a checkpoint in a writer's commit lets the
 * WAL start over while writes never pause), and back to SQLite's default when `onFailure` is
 * called (the worker failed or a checkpoint threw; it then stops). Safe with
 * several processes on one file: each runs its own; a checkpoint that finds another running
 * simply does less. The worker does not keep the process alive.
 */
export function startWalCheckpointer(
  path: string,
  options: { intervalMs?: number; onFailure: (error: Error) => void },
): WalCheckpointer {
  const worker = new Worker(WORKER_SOURCE, {
    eval: true,
    workerData: {
      path,
      intervalMs: options.intervalMs ?? DEFAULT_CHECKPOINT_INTERVAL_MS,
      maxPasses: MAX_PASSES,
      betterSqlite3: createRequire(import.meta.url).resolve("better-sqlite3"),
    },
  });
  worker.unref();
  let closing = false;
  let failed = false;
  const fail = (error: Error) => {
    if (closing || failed) return;
    failed = true;
    void worker.terminate();
    options.onFailure(error);
  };
  worker.on("message", (m: { failed?: string }) => {
    if (m.failed !== undefined) fail(new Error(`WAL checkpoint of ${path} failed: ${m.failed}`));
  });
  worker.on("error", (err) => fail(err));
  worker.on("exit", (code) => fail(new Error(`the WAL checkpointer of ${path} exited (code ${code})`)));
  const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
  return {
    close() {
      if (!closing) {
        closing = true;
        // Referenced while it closes: a caller awaiting this keeps the process alive until then.
        worker.ref();
        if (!failed) worker.postMessage("close");
      }
      return exited;
    },
  };
}
