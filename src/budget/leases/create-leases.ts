// Leases: a gateway replica takes a slice of a key's Budget in one statement and places Holds
// against it in memory; charges go back to the store in batches. src/budget/README.md, "Leases",
// gives the design and what a crash can cost.
import type { LeaseDeps, Leases } from "./api.js";
import { confirm, current } from "./confirm.js";
import { move, owns, reclaimLocal, renew, settle } from "./local-holds.js";
import { place } from "./place.js";
import { leaseState } from "./state.js";
import { closeLeases, drainKey, leaseStats, startLeaseTimers, syncAll } from "./sync.js";

/**
 * Leases of one ledger (one replica). Holds against a lease cost no store round trip; a step per
 * lease (one transaction) flushes charges, renews the lease, gives back free tokens and takes more.
 * Starts two unref'd timers: steps every `syncIntervalMs`, drain requests every `drainPollMs`.
 */
export function createLeases(deps: LeaseDeps): Leases {
  const st = leaseState(deps);
  const timers = startLeaseTimers(st);
  return {
    place: (keyId, demand) => place(st, keyId, demand),
    owns: (holdId) => owns(st, holdId),
    renew: (holdId, usedTokens, ttlMs) => renew(st, holdId, usedTokens, ttlMs),
    settle: (holdId, usedTokens) => settle(st, holdId, usedTokens),
    current: (holdId) => current(st, holdId),
    confirm: (holdId) => confirm(st, holdId),
    move: (holdId, storeHoldId) => move(st, holdId, storeHoldId),
    reclaimLocal: () => reclaimLocal(st),
    drainKey: (keyId) => drainKey(st, keyId),
    syncAll: () => syncAll(st),
    close: () => closeLeases(st, timers),
    stats: () => leaseStats(st),
  };
}
