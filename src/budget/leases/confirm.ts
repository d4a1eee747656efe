// Whether a lease-backed Hold may go on delivering: at once from what the store last confirmed
// (`current`), or after a step of its lease (`confirm`).
import { answeredWithin } from "../answered-within.js";
import type { LeaseStanding } from "./api.js";
import type { Lease, LeasesState } from "./state.js";
import { step } from "./step.js";

/** `Leases.current`: no look at the store needed while the Hold's lease has a quarter of its TTL ahead. */
export function current(st: LeasesState, holdId: string): boolean {
  const { holds, now, s } = st;
  const hold = holds.get(holdId);
  if (hold === undefined || hold.moved !== undefined) return true;
  const { lease } = hold;
  return !lease.lost && now() < lease.expiresAt - s.ttlMs / 4;
}

/** `Leases.confirm`: steps the Hold's lease (3 tries at most) until an answer vouches for it, or it is lost. */
export async function confirm(st: LeasesState, holdId: string): Promise<LeaseStanding> {
  const { holds, now, s } = st;
  const hold = holds.get(holdId);
  if (hold === undefined || hold.moved !== undefined) return { kind: "current" };
  const { lease } = hold;
  for (let tries = 0; !lease.lost; tries++) {
    await withinMargin(st, lease, step(st, lease));
    if (lease.lost) break;
    // A lease closed meanwhile ended with its last Hold: this one is gone, nothing more to confirm.
    if (!holds.has(holdId) || lease.closed) return { kind: "current" };
    // An answer read after the lease's margin (a stall while the step was in flight) vouches for nothing.
    if (now() < lease.expiresAt - s.ttlMs / 4) return { kind: "current" };
    if (tries >= 2) throw new Error(`lease ${lease.id}: its steps' answers come too late to vouch for it`);
  }
  return {
    kind: "lost",
    keyId: lease.keyId,
    uncoveredTokens: Math.max(0, hold.tokens - hold.confirmed),
    periodStart: lease.periodStart,
  };
}

/**
 * `work` (a step of `lease`), or a rejection once what is left of the lease's life (at least an
 * eighth of its TTL) passed with it pending: a store that does not answer (a partition drops the
 * packets, the connection stays open) fails the request closed rather than holding it. The step
 * itself goes on (the lease's chain).
 */
function withinMargin(st: LeasesState, lease: Lease, work: Promise<void>): Promise<void> {
  const { now, s } = st;
  const waitMs = Math.max(lease.expiresAt - now(), s.ttlMs / 8);
  return answeredWithin(
    work,
    waitMs,
    () => `Budget store: lease ${lease.id} was not renewed within ${Math.round(waitMs)} ms`,
  );
}
