// A completion that passed its checks: what was decided before Inference is called (Prepared), and
// the running call (its meter and its one end).

import type { SteeringLease } from "../../lens/index.js";
import type { Inference, InferenceRequest } from "../../upstream/index.js";
import type { AdmissionTicket } from "../admission.js";
import type { FanOutPart } from "../lens-fan-out.js";
import type { ServedModel } from "../model-registry.js";
import type { CallContext } from "../types.js";
import type { UsageMeter } from "../usage-meter.js";
import type { CallDeadline } from "./call-deadline.js";
import type { CallEnd } from "./call-end.js";
import type { Hold } from "./check-order.js";
import type { RateReservation } from "./rate-limits.js";
/** Everything decided before Inference is called. */
export interface Prepared {
  readonly model: ServedModel<Inference>;
  /** The whole request in Inference's form (all prompts, n). */
  readonly body: InferenceRequest;
  /**
   * Prompt tokens as the Hold counts them, per upstream request: one entry (Σ over the prompts),
   * or one per part of a fan-out (its prompt's tokens).
   */
  readonly promptTokens: readonly number[];
  /** The upstream requests of a lens fan-out (proto/API.md §6); undefined: `body` as one request. */
  readonly parts: readonly FanOutPart[] | undefined;
  /** Each prompt's bound of its tokens when they were not counted exactly (the Hold holds the bound; never with `parts`). */
  readonly promptBounds: readonly number[] | undefined;
  /** Each prompt's tokens as the Hold counts them: exact, or `promptBounds`. */
  readonly promptLengths: readonly number[];
  /** The call the request was prepared for (its upstream ids, trace and timings are recorded on it). */
  readonly ctx: CallContext;
  readonly capture: boolean;
  /** The Hold on the key's Budget; undefined with keys off. */
  readonly hold: Hold | undefined;
  /** Its entries in the key's rate-limit windows, corrected to its charge at the end; undefined: not limited. */
  readonly rate: RateReservation | undefined;
  /** The request's decoded steering bytes on the steering budget; released when the request is done. */
  readonly steering: SteeringLease;
  /**
   * The X-Request-Id of the request's next upstream call: the request id, then `<id>-2`, `<id>-3`…
   * (a streamed capture's replay), so that Inference's logs name the gateway's request.
   */
  readonly nextUpstreamId: () => string;
  /** The request's place among its key's requests in flight; released when the request is done. */
  readonly admission: AdmissionTicket;
}

/** A prepared call that runs: its Prepared, its usage meter, its deadline and its one end. */
export interface RunningCall {
  readonly prepared: Prepared;
  readonly meter: UsageMeter;
  /**
   * The signal its Inference requests run under: a non-streamed call's deadline's (the caller's
   * abort or the deadline), a stream's caller's.
   */
  readonly signal: AbortSignal;
  /** A non-streamed call's one deadline, stopped by `call.end`; undefined for a stream. */
  readonly deadline: CallDeadline | undefined;
  readonly call: CallEnd;
}
