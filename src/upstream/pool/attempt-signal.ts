// One attempt's signal: the caller's abort and the replica's take-out, as one signal.
import type { Attempt, Replica } from "./replica-set.js";

/** Per attempt: the caller's signal and the replica's take-out, as one signal. */
export interface AttemptSignal {
  readonly signal: AbortSignal;
  /** True when the replica was taken out (not the caller) while the attempt waited. */
  takenOut(): boolean;
  /** Output reached the caller: a take-out no longer aborts the attempt. */
  keep(): void;
  release(): void;
}

export function attemptSignal(replica: Replica, caller: AbortSignal | undefined): AttemptSignal {
  const controller = new AbortController();
  const attempt: Attempt = { controller, takenOut: false };
  let kept = false;
  const onCaller = () => controller.abort(caller?.reason);
  if (caller?.aborted) onCaller();
  caller?.addEventListener("abort", onCaller, { once: true });
  replica.attempts.add(attempt);
  return {
    signal: controller.signal,
    takenOut: () => !kept && attempt.takenOut && caller?.aborted !== true,
    keep() {
      kept = true;
      replica.attempts.delete(attempt);
    },
    release() {
      caller?.removeEventListener("abort", onCaller);
      replica.attempts.delete(attempt);
    },
  };
}
