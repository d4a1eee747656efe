// The one deadline of a non-streamed completion (proto/API.md §5: 14 minutes): one timer, started
// when the call runs and stopped by its one end, and one signal — the caller's and the deadline's
// as one — that every Inference request of the call runs under. Streams have no such deadline.
import { type ApiError, inferenceDeadlineExceeded } from "../../core/errors/index.js";

/**
 * A deadline of `ms` milliseconds from its construction over the caller's `caller` signal.
 * {@link CallDeadline.signal} aborts with the caller's reason when the caller goes away, or with
 * ApiError 504 `deadline_exceeded` (`Inference did not answer within <ms> ms.`,
 * {@link inferenceDeadlineExceeded}) when `ms` passed first; the Inference port turns that reason
 * into the error its request ends with, so it needs no deadline of its own. Cheaper than
 * AbortSignal.any over AbortSignal.timeout: one controller, one listener, one timer, all dropped
 * by {@link CallDeadline.stop}.
 */
export class CallDeadline {
  readonly #controller = new AbortController();
  readonly #caller: AbortSignal;
  readonly #ms: number;
  #timer: NodeJS.Timeout | undefined;
  /** The reason the signal aborted with when the deadline passed; undefined before. */
  #passed: ApiError | undefined;
  readonly #onCaller = (): void => this.#controller.abort(this.#caller.reason);

  constructor(caller: AbortSignal, ms: number) {
    this.#caller = caller;
    this.#ms = ms;
    if (caller.aborted) {
      this.#onCaller();
      return;
    }
    caller.addEventListener("abort", this.#onCaller, { once: true });
    this.#timer = setTimeout(() => this.#pass(), ms);
  }

  /** Aborted when the caller's signal aborts (its reason) or the deadline passes (its 504). */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Clears the timer and stops following the caller's signal. Idempotent. */
  stop(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#caller.removeEventListener("abort", this.#onCaller);
  }

  /**
   * The error a call that failed with `err` ends with: the deadline's 504 when the deadline passed
   * and the caller had not gone away (`err` as its cause, unless `err` is that 504 itself), else `err`.
   */
  failure(err: unknown): unknown {
    if (this.#passed === undefined || this.#caller.aborted) return err;
    return err === this.#passed ? err : inferenceDeadlineExceeded(this.#ms, err);
  }

  #pass(): void {
    this.#timer = undefined;
    this.#caller.removeEventListener("abort", this.#onCaller);
    this.#passed = inferenceDeadlineExceeded(this.#ms);
    this.#controller.abort(this.#passed);
  }
}

/**
 * `run` under a deadline of its own of `ms` over `signal`: a streamed capture's replay, the one
 * non-streamed Inference request of a stream (proto/API.md §5 bounds it by the same 14 minutes).
 * Throws what `run` throws, the deadline's 504 when it passed first ({@link CallDeadline.failure}).
 */
export async function underDeadline<T>(
  signal: AbortSignal,
  ms: number,
  run: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  const deadline = new CallDeadline(signal, ms);
  try {
    return await run(deadline.signal);
  } catch (err) {
    throw deadline.failure(err);
  } finally {
    deadline.stop();
  }
}
