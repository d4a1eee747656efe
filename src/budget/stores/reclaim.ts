// Reclaim, written once for every backend: each open Hold or lease past its expiry (or of an
// instance) is released in a transaction of its own, its key row locked first, charged what its
// last renewal recorded, in the period it was placed or taken in (./periods.ts).
import type { ReclaimCount } from "../budget-store.js";
import type { StoreBackend, TxRows } from "./backend.js";
import { countersOf, rollover } from "./periods.js";
import { rewriteLease } from "./rows.js";

type Item = { readonly id: string; readonly keyId: string };
/** Whether an item expiring at expiresAt is (still) to be reclaimed, checked under its lock. */
type Due = (expiresAt: number) => boolean;

/** Releases one open Hold, charging what its last renewal recorded. */
async function reclaimHold(rows: TxRows, item: Item, now: number, day: string, due: Due) {
  const [locked, hold] = await Promise.all([rows.lockKey(item.keyId), rows.lockHold(item.id)]);
  if (locked === undefined || hold === undefined || hold.state !== "open" || !due(hold.expiresAt))
    return false;
  const { keyId, id: holdId } = item;
  const c = await countersOf(rows, rollover(rows, locked, now), hold.periodStart);
  const charged = Math.min(hold.usedTokens ?? 0, hold.tokens);
  rows.closeHold(holdId, "reclaimed", hold.usedTokens ?? 0, charged, now);
  c.write(c.spent + charged, c.held - hold.tokens, c.leased);
  rows.addDaily(keyId, day, charged, 0, 1);
  return true;
}

/** Releases one open lease, charging its reclaimCharge. */
async function reclaimLease(rows: TxRows, item: Item, now: number, day: string, due: Due) {
  const [locked, lease] = await Promise.all([rows.lockKey(item.keyId), rows.lockLease(item.id)]);
  if (locked === undefined || lease === undefined || lease.state !== "open" || !due(lease.expiresAt))
    return false;
  const { keyId, id: leaseId } = item;
  const c = await countersOf(rows, rollover(rows, locked, now), lease.periodStart);
  rows.updateLease(leaseId, rewriteLease(lease, { state: "reclaimed", expiresAt: now, closedAt: now }));
  c.write(c.spent + lease.reclaimCharge, c.held, c.leased - lease.tokens);
  rows.addDaily(keyId, day, lease.reclaimCharge, 0, lease.holds);
  return true;
}

/** Reclaims items one transaction (of `tx`) each (a Hold's or lease's key locked first). */
export async function reclaimItems(
  tx: StoreBackend["transaction"],
  items: Awaited<ReturnType<StoreBackend["openItems"]>>,
  now: number,
  day: string,
  due: Due,
): Promise<ReclaimCount> {
  let holds = 0;
  let leases = 0;
  for (const h of items.holds) if (await tx((rows) => reclaimHold(rows, h, now, day, due))) holds++;
  for (const l of items.leases) if (await tx((rows) => reclaimLease(rows, l, now, day, due))) leases++;
  return { holds, leases };
}
