// A gateway process's shutdown (single, or one cluster worker): the first signal drains
// (ACS_DRAIN_DELAY_MS) and closes (ACS_SHUTDOWN_GRACE_MS); a second one skips what is left of the
// drain delay and ends the calls in flight at once. Copies of the first (the process group's and
// npm's; in a worker, the primary's instruction) count once (src/app/shutdown-signals.ts).
import type { FastifyInstance } from "fastify";
import type { Logger } from "pino";
import type { Config } from "../config/index.js";
import { drainAndClose, type Lifecycle } from "../surfaces/http/lifecycle.js";
import type { ClusterWorker } from "./cluster/index.js";
import { onShutdownSignals } from "./shutdown-signals.js";

/** What the shutdown closes, and where it logs. */
interface ProcessShutdown {
  readonly app: FastifyInstance;
  readonly lifecycle: Lifecycle;
  /** Writes the access lines still waiting for their calls' tokens (src/app/build-app.ts `App`). */
  readonly flushAccessLog: () => number;
  readonly config: Pick<Config, "drainDelayMs" | "shutdownGraceMs">;
  readonly logger: Logger;
  /** Set by the first signal; aborted by the second (the drain delay's end). */
  closing: AbortController | undefined;
}

/**
 * Shuts the process down on SIGTERM/SIGINT, and on the primary's instructions when it is a cluster
 * `worker`. Exits 0 once closed, 1 when the close failed or did not finish within the drain delay,
 * the grace and 10 s more (the access lines still waiting are written first, and counted in the
 * error line).
 */
export function shutDownOnSignals(
  target: Omit<ProcessShutdown, "closing">,
  worker: ClusterWorker | undefined,
): void {
  const state: ProcessShutdown = { ...target, closing: undefined };
  onShutdownSignals(state.logger, {
    drain: (signal) => shutdown(state, signal, "signal"),
    now: (signal) => endNow(state, signal, "signal"),
  });
  worker?.onShutdown({
    drain: (signal) => shutdown(state, signal, "primary"),
    now: (signal) => endNow(state, signal, "primary"),
  });
}

/** The second signal: the calls in flight end now. */
function endNow(state: ProcessShutdown, signal: string, from: string): void {
  const { closing } = state;
  if (closing === undefined || closing.signal.aborted) return;
  state.logger.info({ signal, from }, "second signal: ending the calls in flight now");
  closing.abort();
  state.lifecycle.end();
}

/** The first signal: drain and close, then exit (0, or 1 on a failure or a close that hangs). */
function shutdown(state: ProcessShutdown, signal: string, from: string): void {
  if (state.closing !== undefined) return;
  const closing = new AbortController();
  state.closing = closing;
  const { config, logger, flushAccessLog } = state;
  logger.info(
    { signal, from, drainDelayMs: config.drainDelayMs, shutdownGraceMs: config.shutdownGraceMs },
    "shutting down",
  );
  // Past the drain delay, the grace and the 5 s linger of build-server, something is stuck.
  // The access lines still waiting for their calls' tokens are written first: the close, which
  // writes them in its last step, has not got there (pino flushes its lines at exit).
  const force = setTimeout(
    () => {
      const waitingAccessLines = flushAccessLog();
      logger.error({ waitingAccessLines }, "shutdown did not finish: exiting");
      process.exit(1);
    },
    config.drainDelayMs + config.shutdownGraceMs + 10_000,
  );
  force.unref();
  drainAndClose(state.app, state.lifecycle, {
    drainDelayMs: config.drainDelayMs,
    logger,
    signal: closing.signal,
  }).then(
    () => process.exit(0),
    (err: unknown) => {
      // A hook that failed may have kept the close from writing the waiting access lines.
      const waitingAccessLines = flushAccessLog();
      logger.error({ err, waitingAccessLines }, "close failed");
      process.exit(1);
    },
  );
}
