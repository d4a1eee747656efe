// How a ledger is opened: its options (a SQLite file, a PostgreSQL URL, or a store of your own,
// plus what every ledger shares) and their defaults.

import type { BudgetStore } from "../budget-store.js";
import type { LeaseOptions } from "../leases/settings.js";
import type { WritableChange } from "../store-writes.js";
import type { UsageLogOptions } from "../usage/usage-log.js";

/**
 * The longest a request may run without renewing its Hold: the API's 14-minute wait for a
 * non-streamed answer plus one minute of margin, in milliseconds.
 */
export const DEFAULT_HOLD_TTL_MS = 15 * 60_000;

/** How often the ledger reclaims stale Holds and leases by default, in milliseconds. */
export const DEFAULT_RECLAIM_INTERVAL_MS = 60_000;

/** How long authenticate() trusts a key it read from the store, in milliseconds. */
export const DEFAULT_AUTH_CACHE_TTL_MS = 1000;

/** True for a `postgres://` or `postgresql://` URL (ACS_DB selects PostgreSQL); anything else is a SQLite path. */
export function isPostgresUrl(db: string): boolean {
  return /^postgres(ql)?:\/\//i.test(db);
}

/** Options shared by every way of opening a ledger. */
export interface BudgetLedgerCommonOptions {
  /**
   * Names this replica in every Hold and lease it places (for `reclaimOnStart("instance")` after
   * a restart). @default `${hostname}:${pid}:${random}`
   */
  readonly instanceId?: string;
  /** A Hold's lifetime after placeHold or renew, in ms. @default {@link DEFAULT_HOLD_TTL_MS} */
  readonly holdTtlMs?: number;
  /** The clock, in Unix epoch ms. @default Date.now */
  readonly now?: () => number;
  /**
   * Runs reclaimStale() every this many ms on an unref'd timer; 0 turns the timer off.
   * @default {@link DEFAULT_RECLAIM_INTERVAL_MS}
   */
  readonly reclaimIntervalMs?: number;
  /** Called with each error of a background task (reclaim, lease steps). @default process.emitWarning */
  readonly onReclaimError?: (err: unknown) => void;
  /**
   * How long authenticate() reuses a key read from the store, ms; 0 reads it every time. A key
   * revoked on another replica is refused by placeHold at once, and by authenticate within this.
   * @default {@link DEFAULT_AUTH_CACHE_TTL_MS}
   */
  readonly authCacheTtlMs?: number;
  /**
   * Leases (src/budget/README.md, "Leases"): true or options to turn them on, false for one
   * transaction per Hold. @default true on PostgreSQL, false on SQLite
   */
  readonly leases?: boolean | LeaseOptions;
  /** Closed Holds are kept this long (for a repeated or late settle), then deleted, ms. @default holdTtlMs */
  readonly closedHoldRetentionMs?: number;
  /**
   * Told when the ledger turns not writable (a write of the store failed) and writable again
   * (a write succeeded and every pending settle is written): see `BudgetLedger.writable` (api.ts).
   */
  readonly onWritableChange?: (change: WritableChange) => void;
  /**
   * Most settles kept waiting for the store; past it no Hold is placed in the store (503).
   * @default 10,000 (`MAX_PENDING_SETTLES`)
   */
  readonly maxPendingSettles?: number;
  /** The usage log's batching (src/budget/usage/usage-log.ts). @default its defaults */
  readonly usageLog?: UsageLogOptions;
}

/** Options of `createBudgetLedger` (create-ledger.ts): a SQLite file, a PostgreSQL URL, or a store of your own. */
export type BudgetLedgerOptions = BudgetLedgerCommonOptions &
  (
    | {
        /** Path of the SQLite file (created when missing). */
        readonly path: string;
        /** busy_timeout of the SQLite store, in ms. @default 5000 */
        readonly busyTimeoutMs?: number;
        /** SQLite `synchronous` of the store. @default "normal" */
        readonly synchronous?: "full" | "normal";
        /** Who runs the store's WAL checkpoints (see SqliteBudgetStoreOptions). @default "worker" */
        readonly walCheckpoint?: "worker" | "automatic";
        /** One COMMIT per event-loop turn's transactions, or one each (see SqliteBudgetStoreOptions). @default "group" */
        readonly commit?: "group" | "each";
      }
    | {
        /** `postgres://…` of the shared database. */
        readonly postgresUrl: string;
        /** Connections of the pool. @default 4 */
        readonly poolSize?: number;
      }
    | { readonly store: BudgetStore }
  );
