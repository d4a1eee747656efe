// Placing a Hold from a key's lease: at once when the current lease has room, else (one at a
// time per key) after a step that takes or tops up a lease.
import type { KeyState } from "../budget-store.js";
import { demandTokens, type HoldDemand } from "../plan-hold.js";
import type { LeasePlacement } from "./api.js";
import { placeOn } from "./local-holds.js";
import { leaseGrant } from "./settings.js";
import { entryOf, forget, type LeasesState, newLease, retire, usable } from "./state.js";
import { step } from "./step.js";

/** Serializes the slow path of one key within this replica. */
function withKeyLock<T>(st: LeasesState, keyId: string, fn: () => Promise<T>): Promise<T> {
  const e = entryOf(st, keyId);
  const result = e.lock.then(fn, fn);
  e.lock = result.catch(() => undefined);
  return result;
}

/** `Leases.place`: a Hold from the key's lease (taking or topping one up when the Budget has room), or none. */
export async function place(st: LeasesState, keyId: string, demand: HoldDemand): Promise<LeasePlacement> {
  const need = demandTokens(demand);
  const fast = st.byKey.get(keyId)?.current;
  if (fast?.revoked) return { kind: "revoked" };
  if (usable(st, fast) && fast.free >= need) return placeOn(st, fast, need);
  if (st.closing) return { kind: "none" };
  return withKeyLock(st, keyId, () => placeLocked(st, keyId, need));
}

/** The slow path of {@link place}, under the key's lock: a step that gives back and takes a new slice. */
async function placeLocked(st: LeasesState, keyId: string, need: number): Promise<LeasePlacement> {
  const { now, s } = st;
  const e = entryOf(st, keyId);
  let lease = e.current;
  if (lease?.revoked) return { kind: "revoked" };
  if (usable(st, lease) && lease.free >= need) return placeOn(st, lease, need);
  if (lease !== undefined && !usable(st, lease)) {
    retire(st, lease);
    lease = undefined;
  }
  // The last try granted nothing (the end of the Budget): Holds are one transaction each for a while.
  if (lease === undefined && now() < e.noLeaseUntil) return { kind: "none" };
  const grow = (free: number, key: KeyState) => leaseGrant(free, key, need, now(), s);
  if (lease === undefined) {
    lease = newLease(st, keyId);
    e.current = lease;
  }
  try {
    // Give back what the lease has free and take a new slice, in one step.
    await step(st, lease, { grow });
  } catch (err) {
    if (lease.seq === 1 && lease.unconfirmed !== undefined) lease.closing = true;
    throw err;
  }
  if (lease.revoked) return { kind: "revoked" };
  if (!lease.lost && !lease.closing && lease.free >= need) return placeOn(st, lease, need);
  if (lease.periodOver && !lease.closed && !lease.lost) {
    // Another replica's clock rolled the key over first: this lease is the past period's. Retire
    // it, and take a lease of the new period at once (its first step is in the key's period).
    retire(st, lease);
    return placeLocked(st, keyId, need);
  }
  // Not granted (the end of the Budget, or leases blocked): Holds are one transaction each.
  e.noLeaseUntil = now() + s.syncIntervalMs;
  if (!lease.closed && !lease.lost) {
    if (lease.holds.size === 0 && lease.seq === 1 && lease.free === 0) forget(st, lease);
    else retire(st, lease);
  }
  return { kind: "none" };
}
