// How SIGTERM and SIGINT are counted. One signal often arrives more than once: Ctrl-C,
// `kill -- -PGID` and systemd's KillMode=control-group send it to every process of the group, and
// a parent that forwards signals (npm's `npm start`) sends it to its child again, within
// milliseconds. Those copies are one signal; only a signal that comes later (an operator's second
// Ctrl-C) is a second one, which ends the calls in flight at once.
import type { Logger } from "pino";

/**
 * A signal within this long of the first one is a copy of it, ms. An operator's second Ctrl-C
 * comes seconds later; npm's forwarded copy comes within milliseconds.
 */
export const SIGNAL_COPY_MS = 1000;

/** What a signal is: the first (drain), a copy of the first (nothing), or a later one (end now). */
export type SignalKind = "first" | "copy" | "second";

/**
 * A counter of the shutdown signals one process receives: the first is `first`, any within
 * `copyMs` of it `copy`, any later one `second`.
 */
export function createSignalCounter(
  copyMs: number = SIGNAL_COPY_MS,
  now: () => number = () => performance.now(),
): () => SignalKind {
  let firstAt: number | undefined;
  return () => {
    const at = now();
    if (firstAt === undefined) {
      firstAt = at;
      return "first";
    }
    return at - firstAt < copyMs ? "copy" : "second";
  };
}

/** What a process does on a shutdown signal (see {@link onShutdownSignals}). */
export interface ShutdownHandlers {
  /** The first signal: drain and close. */
  drain(signal: string): void;
  /** A second signal, {@link SIGNAL_COPY_MS} or more after the first: end the calls in flight now. */
  now(signal: string): void;
}

/** Calls `handlers` on SIGTERM and SIGINT as {@link createSignalCounter} counts them. */
export function onShutdownSignals(logger: Logger, handlers: ShutdownHandlers): void {
  const count = createSignalCounter();
  const on = (signal: NodeJS.Signals): void => {
    const kind = count();
    if (kind === "first") handlers.drain(signal);
    else if (kind === "second") handlers.now(signal);
    else
      logger.debug(
        { signal },
        "the shutdown signal again (from the process group and from a parent): counted once",
      );
  };
  process.on("SIGTERM", () => on("SIGTERM"));
  process.on("SIGINT", () => on("SIGINT"));
}
