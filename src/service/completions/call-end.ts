// The one end of a prepared completion: whatever way it ends — an answer, an error, a refusal after
// its Hold was placed, a consumer that stopped reading — what it holds is given back once.
import type { SteeringLease } from "../../lens/index.js";
import type { AdmissionTicket } from "../admission.js";
import type { CallDeadline } from "./call-deadline.js";

/** What a prepared call holds until it ends, besides its Hold. */
export interface CallHeld {
  /** Its decoded steering bytes on the steering budget. */
  readonly steering: SteeringLease;
  /** Its place among its key's requests in flight. */
  readonly admission: AdmissionTicket;
  /** Its deadline (a non-streamed call's, ./call-deadline.ts); none for a stream or a refusal. */
  readonly deadline?: CallDeadline | undefined;
}

/**
 * Ends one call: stops its deadline's timer, releases its steering lease and admission ticket,
 * then settles its Hold through `settle(failure)` (the usage meter's charge for a call that
 * reached Inference, 0 for one refused before). Idempotent: the first {@link CallEnd.end} does it all, a later one returns the
 * same promise, whatever failure it is given.
 */
export class CallEnd {
  #ending: Promise<void> | undefined;

  constructor(
    private readonly held: CallHeld,
    private readonly settle: (failure: unknown) => Promise<void>,
  ) {}

  /** Whether {@link CallEnd.end} was called. */
  get ended(): boolean {
    return this.#ending !== undefined;
  }

  /** Gives back what the call holds and settles its Hold, once; `failure` is why it ended, if it failed. */
  end(failure?: unknown): Promise<void> {
    this.#ending ??= this.#end(failure);
    return this.#ending;
  }

  async #end(failure: unknown): Promise<void> {
    this.held.deadline?.stop();
    this.held.steering.release();
    this.held.admission.release();
    await this.settle(failure);
  }
}
