// The per-key caps (proto/API.md §9) counted by the primary for every worker: a worker asks for
// each keyed request's place (worker-admission.ts) and gives the place back when the request
// ends; a worker that exits gives back every place it held.
import type { Worker } from "node:cluster";
import { ApiError } from "../../core/errors/index.js";
import type { AdmissionDemand } from "../../service/admission.js";
import type { ToWorker } from "./ipc.js";
import type { Primary, Slot } from "./primary-state.js";

/** One request's place for `slot`'s worker: a ticket, or the refusal's message (neither: a failure). */
function admitFor(
  primary: Primary,
  slot: Slot,
  keyId: string,
  demand: AdmissionDemand,
): { ticket?: number; upstreamRequests?: number; refused?: string } {
  try {
    const place = primary.admission.admit(keyId, demand);
    const ticket = primary.nextTicket++;
    slot.places.set(ticket, place);
    return { ticket, upstreamRequests: place.upstreamRequests };
  } catch (err) {
    if (err instanceof ApiError && err.code === "rate_limited") return { refused: err.message };
    // A bug: the worker counts the request alone rather than the primary failing.
    primary.logger.error({ err, worker: slot.n }, "counting a request's place failed");
    return {};
  }
}

/** A worker's `admit` `id`: the place counted and the answer sent (the place back if it fails). */
export function brokerAdmit(
  primary: Primary,
  slot: Slot,
  worker: Worker,
  msg: { readonly id: number; readonly keyId: string; readonly demand: AdmissionDemand },
): void {
  // A worker that has exited (its 'exit' can come before the last messages it wrote) or whose
  // channel is gone holds no place: none is counted for it (onExit has released its slot's).
  if (slot.worker !== worker || !worker.isConnected()) return;
  const answer = admitFor(primary, slot, msg.keyId, msg.demand);
  // The worker may have died since it wrote the admit: the write then fails (EPIPE), and the
  // place goes back rather than the failure being thrown in the primary.
  worker.send({ ...answer, acs: "admit", id: msg.id } satisfies ToWorker, undefined, undefined, (err) => {
    if (err === null || answer.ticket === undefined) return;
    releasePlace(slot, answer.ticket);
  });
}

/** The place of `ticket` back (a worker's `release`); nothing for a ticket already back. */
export function releasePlace(slot: Slot, ticket: number): void {
  slot.places.get(ticket)?.release();
  slot.places.delete(ticket);
}

/** `slot`'s worker exited: its requests ended with it, their places go back. */
export function releaseSlotPlaces(slot: Slot): void {
  for (const place of slot.places.values()) place.release();
  slot.places.clear();
}
