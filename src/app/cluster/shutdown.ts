// The cluster's shutdown, by the primary: on SIGTERM/SIGINT every worker runs its normal close
// path (told over IPC: the worker may have had the same signal from the process group, which is
// one shutdown, not a second signal); then the engine is stopped and the primary exits.
import { onShutdownSignals } from "../shutdown-signals.js";
import type { ToWorker } from "./ipc.js";
import type { Primary, Slot } from "./primary-state.js";

/**
 * The first signal drains; its copies (the process group's and a parent's, npm's) count once; a
 * later one has every worker end its calls in flight now.
 */
export function shutDownOnSignals(primary: Primary): void {
  onShutdownSignals(primary.logger, {
    drain: (signal) => shutdown(primary, signal),
    now(signal) {
      primary.logger.info({ signal }, "second signal: every worker ends the calls in flight now");
      for (const s of primary.slots) tell(s, signal, true);
    },
  });
}

/** Kills every worker (SIGKILL), stops the engine and exits with `code`. */
export async function exitAll(primary: Primary, code: number): Promise<never> {
  primary.closing = true;
  for (const s of primary.slots) s.worker?.process.kill("SIGKILL");
  await primary.engine?.stop();
  process.exit(code);
}

/**
 * A listening worker is told to drain rather than sent a signal: the signal the process group
 * got reached it too, and the primary's copy would count as a second one. A worker still
 * starting has no handler yet: SIGTERM ends it at once.
 */
function tell(slot: Slot, signal: string, now: boolean): void {
  const w = slot.worker;
  if (w === undefined) return;
  if (!slot.listening || !w.isConnected()) {
    if (!now) w.process.kill("SIGTERM");
    return;
  }
  w.send({ acs: "shutdown", signal, now } satisfies ToWorker, undefined, undefined, (err) => {
    if (err !== null && !now) w.process.kill("SIGTERM");
  });
}

/**
 * Every worker closes; those still running after `forceAfterMs` are SIGKILLed. Once all have
 * exited, the engine is stopped and the primary exits 0 (1 if a worker did not end cleanly, or
 * the engine's stop failed).
 */
function shutdown(primary: Primary, signal: string): void {
  const { slots, logger, engine } = primary;
  if (primary.closing) return;
  primary.closing = true;
  logger.info({ signal, workers: slots.length }, "shutting down: every worker closes");
  const live = slots.flatMap((s) => (s.worker === undefined ? [] : [s.worker]));
  const force = setTimeout(() => {
    const left = slots.flatMap((s) => (s.worker === undefined ? [] : [s.worker.process.pid]));
    logger.error({ workerPids: left }, "workers still running after the shutdown's time; killing them");
    for (const w of live) w.process.kill("SIGKILL");
  }, primary.options.forceAfterMs ?? 60_000);
  force.unref();
  for (const s of slots) tell(s, signal, false);
  Promise.all(
    live.map((w) =>
      w.isDead() ? undefined : new Promise<void>((resolve) => w.once("exit", () => resolve())),
    ),
  )
    .then(() => engine?.stop())
    .then(
      () => process.exit(primary.unclean ? 1 : 0),
      (err: unknown) => {
        logger.error({ err }, "stopping the engine failed");
        process.exit(1);
      },
    );
}
