// Releasing what was left behind: stale Holds and leases (on a timer and on demand), and what a
// previous run left at start-up.
import type { ReclaimCount } from "../budget-store.js";
import type { LedgerState } from "./state.js";
import { utcDay } from "./utc-day.js";

/** `BudgetLedger.reclaimStale`: local lease Holds, then expired store items; purges closed rows. */
export async function reclaimStale(l: LedgerState): Promise<ReclaimCount> {
  const { leases, now, store, retentionMs } = l;
  const local = leases?.reclaimLocal() ?? 0;
  const t = now();
  const r = await store.reclaimExpired(t, utcDay(t));
  await store.purgeClosed(t - retentionMs);
  return { holds: r.holds + local, leases: r.leases };
}

/** `BudgetLedger.reclaimOnStart`: every open Hold and lease in the store, or (`instance`) this instanceId's. */
export async function reclaimOnStart(
  l: LedgerState,
  scope: "all" | "instance" = "all",
): Promise<ReclaimCount> {
  const { now, store, instanceId } = l;
  const t = now();
  return store.reclaimOpen(t, utcDay(t), scope === "instance" ? instanceId : undefined);
}

/**
 * Runs reclaimStale on the ledger every `intervalMs` (none when 0), skipping a turn while the last
 * one still runs; a failure goes to onError. The timer is unref'd; undefined when there is none.
 */
export function startReclaimTimer(
  l: LedgerState,
  intervalMs: number,
  onError: (err: unknown) => void,
): ReturnType<typeof setInterval> | undefined {
  let reclaiming = false;
  const timer =
    intervalMs > 0
      ? setInterval(() => {
          if (reclaiming) return;
          reclaiming = true;
          reclaimStale(l)
            .catch(onError)
            .finally(() => {
              reclaiming = false;
            });
        }, intervalMs)
      : undefined;
  timer?.unref();
  return timer;
}
