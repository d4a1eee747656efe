// What the functions of one open ledger share. Behaviour is in the sibling files (auth.ts,
// holds.ts, standing.ts, settle.ts, reclaim.ts, key-admin.ts), each taking this state first.
import type { BudgetStore, KeyRecord } from "../budget-store.js";
import type { Leases } from "../leases/api.js";
import type { LeaseSettings } from "../leases/settings.js";
import type { StoreWrites } from "../store-writes.js";
import type { UsageLog } from "../usage/usage-log.js";

/** What the ledger knows of one of its Holds in the store (see `LedgerState.storeHolds`). */
export type StoreHoldState = { expiresAt: number; ttlMs: number; lost: boolean };

/**
 * What the functions of one ledger share: its store (each write watched), leases and settings,
 * fixed when it opens (times Unix epoch ms, durations ms), and its two maps.
 */
export interface LedgerState {
  readonly store: BudgetStore;
  readonly writes: StoreWrites;
  readonly leases: Leases | undefined;
  /** One record per settled request, written in batches (../usage/usage-log.ts). */
  readonly usageLog: UsageLog;
  readonly now: () => number;
  readonly instanceId: string;
  readonly holdTtlMs: number;
  readonly settings: LeaseSettings;
  /** How long closed Holds and leases are kept before they are purged. */
  readonly retentionMs: number;
  readonly authCacheTtlMs: number;
  /**
   * This replica's open Holds in the store (placed there, or moved there from a lost lease), by
   * the id the request knows: the expiry the store last confirmed (Unix epoch ms) and the TTL it
   * was given (ms). `BudgetLedger.standing` vouches for one without a look at the store while
   * more than a quarter of that TTL is ahead; `lost` once a renewal found it closed (reclaimed:
   * never vouched for again). Deleted at settle.
   */
  readonly storeHolds: Map<string, StoreHoldState>;
  /** Keys read lately, by the key itself, least recently used first (see authenticate). */
  readonly authCache: Map<string, { record: KeyRecord; at: number }>;
}
