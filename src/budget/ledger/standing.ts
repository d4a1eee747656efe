// Keeping a Hold alive: renewals, and whether its tokens are still the request's to deliver
// (at once from what the store last confirmed, or after a look at the store).
import { answeredWithin } from "../answered-within.js";
import type { Leases } from "../leases/api.js";
import { checkInt, revokedKey } from "./errors.js";
import { placeInStore } from "./holds.js";
import type { LedgerState, StoreHoldState } from "./state.js";

/** `BudgetLedger.renew`: on the Hold's lease or in the store; keeps a store Hold's known expiry. */
export async function renew(
  l: LedgerState,
  holdId: string,
  usedTokens = 0,
  ttlMs?: number,
): Promise<boolean> {
  const { holdTtlMs, now, storeHolds, leases, store } = l;
  const ttl = ttlMs ?? holdTtlMs;
  checkInt("ttlMs", ttl, 1);
  checkInt("usedTokens", usedTokens, 0);
  const expiresAt = now() + ttl;
  // Read before the store answers: a renewal sent while the Hold was still on its lease (lost
  // meanwhile, answered false) says nothing of the store Hold it moved to.
  const inStore = storeHolds.get(holdId);
  const renewed =
    leases?.owns(holdId) === true
      ? await leases.renew(holdId, usedTokens, ttl)
      : await store.renewHold(holdId, expiresAt, usedTokens);
  if (inStore !== undefined && storeHolds.get(holdId) === inStore) {
    if (!renewed) inStore.lost = true;
    else {
      // What the store now has: a renewal writes its expiry as given, shorter ones too.
      inStore.expiresAt = expiresAt;
      inStore.ttlMs = ttl;
    }
  }
  return renewed;
}

/** `BudgetLedger.standing`: true, or (near its expiry, or on a lease not current) a look at the store. */
export function standing(l: LedgerState, holdId: string): true | Promise<boolean> {
  const { storeHolds, now, leases } = l;
  const inStore = storeHolds.get(holdId);
  if (inStore !== undefined) {
    if (inStore.lost) return Promise.resolve(false);
    return now() < inStore.expiresAt - inStore.ttlMs / 4 ? true : confirmInStore(l, holdId, inStore);
  }
  if (leases === undefined || leases.current(holdId)) return true;
  return confirmLeased(l, leases, holdId);
}

/**
 * {@link standing} for a Hold in the store near or past the expiry the store last confirmed:
 * renews it. A Hold still open was never reclaimed, so its tokens are still the request's
 * (whatever the stall); one no longer open was reclaimed: false.
 */
async function confirmInStore(l: LedgerState, holdId: string, inStore: StoreHoldState): Promise<boolean> {
  const { now } = l;
  for (let tries = 0; ; tries++) {
    const { ttlMs } = inStore;
    const expiresAt = now() + ttlMs;
    const waitMs = Math.max(inStore.expiresAt - now(), ttlMs / 8);
    const renewed = await answeredWithin(
      renew(l, holdId, 0, ttlMs),
      waitMs,
      () => `Budget store: Hold ${holdId} was not renewed within ${Math.round(waitMs)} ms`,
    );
    if (!renewed) return false;
    // An answer read after the margin (a stall while the renewal was in flight) vouches for nothing.
    if (now() < expiresAt - ttlMs / 4) return true;
    if (tries >= 2) throw new Error(`Hold ${holdId}: the store's answers come too late to vouch for it`);
  }
}

/**
 * {@link standing} for a lease-backed Hold this replica could not vouch for: one step of its
 * lease; a lease lost meanwhile (reclaimed, its tokens free for others) hands the Hold to one
 * placed in the store for exactly what it may still use, whole or not at all.
 */
async function confirmLeased(l: LedgerState, leases: Leases, holdId: string): Promise<boolean> {
  const { writes, storeHolds, holdTtlMs, now } = l;
  const standing = await leases.confirm(holdId);
  if (standing.kind === "current") return true;
  if (standing.uncoveredTokens === 0) return true;
  // Exactly uncoveredTokens: uncoveredTokens − 1 as prompt tokens and 1 generated token. A
  // max_tokens of 1 cannot be clamped, so the Hold is whole or `insufficient` (after the other
  // replicas' leases were asked for their free tokens).
  const {
    holdId: storeHoldId,
    outcome,
    expiresAt,
  } = await placeInStore(
    l,
    standing.keyId,
    { promptTokens: standing.uncoveredTokens - 1, prompts: 1, n: 1, maxTokens: 1 },
    standing.periodStart, // in the lease's Budget period, a past one included
  );
  // Revoked meanwhile: nothing more for this key either (the ledger's 401 says so).
  if (outcome.kind === "revoked" || outcome.kind === "unknown_key") throw revokedKey(undefined);
  if (outcome.kind !== "held") return false;
  if (!leases.move(holdId, storeHoldId)) {
    // The local Hold ended meanwhile (reclaimed as stale): give the store's Hold back (kept and
    // written later if the store fails it now).
    await writes.settle(storeHoldId, 0);
    return false;
  }
  const inStore = { expiresAt, ttlMs: holdTtlMs, lost: false };
  storeHolds.set(holdId, inStore);
  // An answer read after the margin (a stall once the Hold was placed) vouches for nothing.
  return now() < expiresAt - holdTtlMs / 4 ? true : confirmInStore(l, holdId, inStore);
}
