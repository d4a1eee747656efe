// The Holds a replica places in memory against its leases: placed, renewed, settled, moved to
// the store when their lease is lost, reclaimed when stale.
import { generateHoldId } from "../api-key.js";
import type { LedgerSettleResult } from "../store-writes.js";
import type { LeasePlacement } from "./api.js";
import { type Lease, type LeasesState, type LocalHold, TOMBSTONES, type Tombstone } from "./state.js";
import { step } from "./step.js";

/** Places a Hold of `need` tokens on the lease (which has them free). */
export function placeOn(st: LeasesState, lease: Lease, need: number): LeasePlacement {
  const { now, deps, holds } = st;
  const hold: LocalHold = {
    id: generateHoldId(),
    lease,
    tokens: need,
    recorded: 0,
    confirmed: 0,
    expiresAt: now() + deps.holdTtlMs,
    moved: undefined,
  };
  lease.free -= need;
  lease.held += need;
  lease.holds.add(hold);
  lease.lastPlacedAt = now();
  holds.set(hold.id, hold);
  return { kind: "held", holdId: hold.id, tokens: need };
}

/** Moves a live Hold out of its lease: `charge` to be flushed, the rest free again. */
function closeLocal(st: LeasesState, hold: LocalHold, charge: number, state: Tombstone["state"]): void {
  const { holds, tombstones } = st;
  const { lease } = hold;
  holds.delete(hold.id);
  lease.holds.delete(hold);
  lease.dirty.delete(hold);
  lease.held -= hold.tokens;
  lease.floor -= hold.recorded;
  lease.pendingCharge += charge;
  lease.pendingChargeIfLost += Math.max(0, charge - hold.confirmed);
  if (state === "settled") lease.pendingSettled += 1;
  lease.free += hold.tokens - charge;
  tombstones.set(hold.id, {
    keyId: lease.keyId,
    state,
    charged: charge,
    tokens: hold.tokens,
    periodStart: lease.periodStart,
  });
  if (tombstones.size > TOMBSTONES) {
    const oldest = tombstones.keys().next().value;
    if (oldest !== undefined) tombstones.delete(oldest);
  }
}

/** `Leases.owns`: the Hold is live here, or was. */
export function owns(st: LeasesState, holdId: string): boolean {
  return st.holds.has(holdId) || st.tombstones.has(holdId);
}

/** `Leases.renew`: records usedTokens (durable once a step carries it) or renews the moved Hold in the store. */
export async function renew(
  st: LeasesState,
  holdId: string,
  usedTokens: number,
  ttlMs: number,
): Promise<boolean> {
  const { holds, now, store } = st;
  const hold = holds.get(holdId);
  if (hold === undefined) return false;
  hold.expiresAt = now() + ttlMs;
  if (hold.moved !== undefined) {
    const used = Math.max(0, Math.min(usedTokens, hold.tokens) - hold.confirmed);
    return store.renewHold(hold.moved, hold.expiresAt, used);
  }
  const recorded = Math.min(Math.max(hold.recorded, usedTokens), hold.tokens);
  if (recorded > hold.recorded) {
    hold.lease.floor += recorded - hold.recorded;
    hold.recorded = recorded;
    hold.lease.dirty.set(hold, recorded);
    // The renewal is durable once a step carrying it is applied.
    await step(st, hold.lease);
  }
  return holds.has(holdId) && !hold.lease.lost;
}

/**
 * A late charge of a Hold of this replica, by its id (once), to the period of its lease, kept while
 * the store cannot write it.
 */
async function chargeLate(
  st: LeasesState,
  holdId: string,
  keyId: string,
  tokens: number,
  periodStart: number | undefined,
): Promise<LedgerSettleResult> {
  const { deps, instanceId } = st;
  const input = { holdId, keyId, tokens, instanceId, ...(periodStart === undefined ? {} : { periodStart }) };
  const charged = await deps.writes.chargeLate(input);
  return charged === "pending"
    ? { outcome: "pending", chargedTokens: 0, releasedTokens: 0 }
    : { outcome: "settled_after_reclaim", chargedTokens: charged, releasedTokens: 0 };
}

/** `Leases.settle`: a live Hold ends here, moved, or late; a closed one is settled at most once more. */
export async function settle(
  st: LeasesState,
  holdId: string,
  usedTokens: number,
): Promise<LedgerSettleResult> {
  const { holds, tombstones } = st;
  const hold = holds.get(holdId);
  if (hold !== undefined) return settleLive(st, hold, usedTokens);
  const dead = tombstones.get(holdId);
  if (dead === undefined || dead.state === "settled") {
    return { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
  }
  // Reclaimed here as stale, then settled: the rest of its charge, up to what the Budget has free.
  tombstones.set(holdId, { ...dead, state: "settled" });
  const extra = Math.max(0, Math.min(usedTokens, dead.tokens) - dead.charged);
  if (extra === 0) return { outcome: "settled_after_reclaim", chargedTokens: 0, releasedTokens: 0 };
  return chargeLate(st, holdId, dead.keyId, extra, dead.periodStart);
}

/** The settle of a Hold still live here: on its lease, on the store Hold it moved to, or late (lease lost). */
async function settleLive(st: LeasesState, hold: LocalHold, usedTokens: number): Promise<LedgerSettleResult> {
  const { holds, tombstones, deps } = st;
  const holdId = hold.id;
  const charge = Math.min(usedTokens, hold.tokens);
  if (hold.moved !== undefined) {
    // The store's Hold settles what the reclaim of the lease did not charge.
    holds.delete(holdId);
    hold.lease.holds.delete(hold);
    tombstones.set(holdId, {
      keyId: hold.lease.keyId,
      state: "settled",
      charged: 0,
      tokens: hold.tokens,
      periodStart: hold.lease.periodStart,
    });
    const result = await deps.writes.settle(hold.moved, Math.max(0, charge - hold.confirmed));
    return result ?? { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
  }
  if (!hold.lease.lost) {
    const { lease } = hold;
    closeLocal(st, hold, charge, "settled");
    // A closing lease gives what the Hold released back to the Budget before settle resolves.
    if (lease.closing && (hold.tokens > charge || lease.holds.size === 0)) {
      await step(st, lease).catch(deps.onError); // settled here either way; a failed step is sent again
    }
    return { outcome: "settled", chargedTokens: charge, releasedTokens: hold.tokens - charge };
  }
  // The lease was reclaimed by another replica: charged what the store had recorded for it.
  holds.delete(holdId);
  hold.lease.holds.delete(hold);
  const { keyId, periodStart } = hold.lease;
  tombstones.set(holdId, { keyId, state: "settled", charged: 0, tokens: hold.tokens, periodStart });
  return chargeLate(st, holdId, keyId, Math.max(0, charge - hold.confirmed), periodStart);
}

/** `Leases.move`: the Hold of a lost lease is taken over by `storeHoldId`; false when it is not live here. */
export function move(st: LeasesState, holdId: string, storeHoldId: string): boolean {
  const hold = st.holds.get(holdId);
  if (hold === undefined) return false;
  hold.moved = storeHoldId;
  return true;
}

/** `Leases.reclaimLocal`: releases local Holds past their expiry, charged what their last renew recorded. */
export function reclaimLocal(st: LeasesState): number {
  const { now, holds } = st;
  const t = now();
  let n = 0;
  for (const hold of [...holds.values()]) {
    // A moved Hold is the store's: its row is reclaimed there, and its settle goes there.
    if (hold.expiresAt > t || hold.moved !== undefined) continue;
    closeLocal(st, hold, hold.recorded, "reclaimed");
    n++;
  }
  return n;
}
