// Steps of every lease at once: on the sync timer, on drain requests of other replicas, on a
// revoke here, and at close; the two timers that run them.
import { allLeases, forget, type LeasesState, retire } from "./state.js";
import { step } from "./step.js";

/** `Leases.syncAll`: steps every lease that has something to send or nears its renewal; retires idle ones. */
export async function syncAll(st: LeasesState): Promise<void> {
  const { now, s, deps } = st;
  const t = now();
  const work: Promise<void>[] = [];
  for (const lease of [...allLeases(st)]) {
    if (lease.closed || lease.lost) {
      forget(st, lease);
      continue;
    }
    if (!lease.closing && t - lease.lastPlacedAt >= s.idleMs) retire(st, lease);
    const due =
      lease.unconfirmed !== undefined ||
      lease.pendingCharge > 0 ||
      lease.dirty.size > 0 ||
      (lease.closing && (lease.free > 0 || lease.holds.size === 0)) ||
      lease.expiresAt - t < s.ttlMs / 2;
    if (due) work.push(step(st, lease));
  }
  const results = await Promise.allSettled(work);
  for (const r of results) if (r.status === "rejected") deps.onError(r.reason);
}

/** Retires and steps (acknowledging) the leases that other replicas asked this one to drain. */
async function pollDrains(st: LeasesState): Promise<void> {
  const { store, instanceId, deps } = st;
  let any = false;
  for (const _ of allLeases(st)) {
    any = true;
    break;
  }
  if (!any) return;
  const ids = new Set(await store.drainRequests(instanceId));
  if (ids.size === 0) return;
  const work: Promise<void>[] = [];
  for (const lease of [...allLeases(st)]) {
    if (!ids.has(lease.id)) continue;
    retire(st, lease);
    work.push(step(st, lease, { ack: true }));
  }
  const results = await Promise.allSettled(work);
  for (const r of results) if (r.status === "rejected") deps.onError(r.reason);
}

/** `Leases.drainKey`: every lease of the key marked revoked, retired and stepped (its free tokens back). */
export async function drainKey(st: LeasesState, keyId: string): Promise<void> {
  const e = st.byKey.get(keyId);
  if (e === undefined) return;
  const all = [...(e.current ? [e.current] : []), ...e.retired];
  for (const lease of all) {
    lease.revoked = true;
    retire(st, lease);
  }
  await Promise.all(all.map((l) => step(st, l)));
}

/** The two unref'd timers of a set of leases. */
export interface LeaseTimers {
  readonly sync: ReturnType<typeof setInterval>;
  readonly drain: ReturnType<typeof setInterval>;
}

/**
 * Starts syncAll every `syncIntervalMs` and the drain poll every `drainPollMs` (unref'd), each
 * skipping a turn while its last run still runs; a failed poll goes to onError.
 */
export function startLeaseTimers(st: LeasesState): LeaseTimers {
  const { s, deps } = st;
  const sync = setInterval(() => {
    if (st.syncing) return;
    st.syncing = true;
    void syncAll(st).finally(() => {
      st.syncing = false;
    });
  }, s.syncIntervalMs);
  sync.unref();
  const drain = setInterval(() => {
    if (st.polling) return;
    st.polling = true;
    void pollDrains(st)
      .catch(deps.onError)
      .finally(() => {
        st.polling = false;
      });
  }, s.drainPollMs);
  drain.unref();
  return { sync, drain };
}

/** `Leases.close`: stops the timers, retires every lease and steps each (failures go to onError). */
export async function closeLeases(st: LeasesState, timers: LeaseTimers): Promise<void> {
  const { deps } = st;
  st.closing = true;
  clearInterval(timers.sync);
  clearInterval(timers.drain);
  for (const lease of [...allLeases(st)]) retire(st, lease);
  const results = await Promise.allSettled([...allLeases(st)].map((l) => step(st, l)));
  for (const r of results) if (r.status === "rejected") deps.onError(r.reason);
}

/** `Leases.stats`: live leases, local Holds and the leases' free tokens. */
export function leaseStats(st: LeasesState): { leases: number; holds: number; freeTokens: number } {
  let n = 0;
  let free = 0;
  for (const l of allLeases(st)) {
    n++;
    free += l.free;
  }
  return { leases: n, holds: st.holds.size, freeTokens: free };
}
