// ACS_WORKER_TIMEOUT_MS: the primary SIGKILLs a worker not heard from for that long (its event
// loop stalled), listening or still starting; the worker's 'exit' starts another in its place
// (or, for worker 1 at the gateway's start, ends the start with exit 1).
import type { Primary, Slot } from "./primary-state.js";

/** A worker still starting is killed after this many times ACS_WORKER_TIMEOUT_MS of silence. */
const STARTING_TIMEOUT_FACTOR = 2;

/** A worker that has not reported since its fork is killed after this many times ACS_WORKER_TIMEOUT_MS. */
const FIRST_REPORT_TIMEOUT_FACTOR = 4;

/** How often the primary checks its workers' silence against ACS_WORKER_TIMEOUT_MS, ms. */
const WATCHDOG_TICK_MS = 1000;

/** Checks every worker's silence each second (nothing when `config.workerTimeoutMs` is 0). */
export function startWatchdog(primary: Primary): void {
  if (primary.config.workerTimeoutMs <= 0) return;
  let tickedAt = performance.now();
  setInterval(() => {
    const now = performance.now();
    // This loop itself was held up (the primary stopped or busy): the workers' reports waited
    // unread in its channels meanwhile, so that time is not counted as their silence. Only
    // that time: a worker stuck before it is still counted silent for what came before.
    const lateMs = now - tickedAt - WATCHDOG_TICK_MS;
    tickedAt = now;
    for (const slot of primary.slots) {
      if (lateMs > WATCHDOG_TICK_MS) slot.heardAt += lateMs;
      checkSilence(primary, slot, now);
    }
  }, WATCHDOG_TICK_MS).unref();
}

/** Kills `slot`'s worker if it has been silent past its limit (and another listens, if it does). */
function checkSilence(primary: Primary, slot: Slot, now: number): void {
  const timeoutMs = primary.config.workerTimeoutMs;
  const worker = slot.worker;
  if (worker === undefined || slot.timedOut) return;
  // Silent since its last report, or since its fork before its first. A worker still
  // starting gets twice the time (its modules are evaluated in long synchronous steps,
  // which a starved CPU stretches to seconds), one that has not reported yet four times
  // (Node's own start, 0.4 s alone, 10 s and more on a starved CPU).
  const silentMs = now - slot.heardAt;
  const limitMs = slot.listening
    ? timeoutMs
    : (slot.reported ? STARTING_TIMEOUT_FACTOR : FIRST_REPORT_TIMEOUT_FACTOR) * timeoutMs;
  if (silentMs < limitMs) return;
  // One at a time: the shared listening socket closes once no worker holds it (node:cluster),
  // resetting the connections waiting in its queue; a stalled worker still holds it. So the
  // last worker standing waits for another's replacement to listen. (Closing: none comes.)
  // A worker still starting holds no connection.
  const another = primary.slots.some((o) => o !== slot && o.listening && !o.timedOut);
  if (slot.listening && !primary.closing && !another) return;
  slot.timedOut = true;
  primary.timeouts++;
  const closing = primary.closing && slot.listening ? " while the gateway closes" : "";
  primary.logger.error(
    {
      worker: slot.n,
      workerPid: worker.process.pid,
      silentMs: Math.round(silentMs),
      limitMs,
      timeoutMs,
    },
    `${silenceLine(slot)}${closing}; ${killLine(primary, slot)}`,
  );
  worker.process.kill("SIGKILL");
}

/** What the worker's silence was, for the log line. */
function silenceLine(slot: Slot): string {
  return slot.listening
    ? "worker not heard from within ACS_WORKER_TIMEOUT_MS (its event loop stalled)"
    : slot.reported
      ? "worker not heard from within twice ACS_WORKER_TIMEOUT_MS while starting (its event loop stalled)"
      : "worker sent no report within four times ACS_WORKER_TIMEOUT_MS of its fork (stuck before the gateway's code ran)";
}

/** What follows the kill, for the log line. */
function killLine(primary: Primary, slot: Slot): string {
  return primary.closing
    ? "killing it"
    : !slot.listening && primary.startFailed !== undefined
      ? "killing it: the gateway's start fails"
      : "killing it and starting another in its place";
}
