// What the lease side of a ledger needs and offers: see src/budget/leases/create-leases.ts.
import type { BudgetStore } from "../budget-store.js";
import type { HoldDemand } from "../plan-hold.js";
import type { LedgerSettleResult, StoreWrites } from "../store-writes.js";
import type { LeaseSettings } from "./settings.js";

/** Dependencies of `createLeases` (create-leases.ts). */
export interface LeaseDeps {
  readonly store: BudgetStore;
  readonly instanceId: string;
  readonly settings: LeaseSettings;
  readonly now: () => number;
  readonly dayOf: (now: number) => string;
  readonly holdTtlMs: number;
  readonly onError: (err: unknown) => void;
  /**
   * The ledger's writes that end a Hold (a moved Hold's settle, a late charge): kept and written
   * again, once per Hold id, when the store fails them (src/budget/store-writes.ts).
   */
  readonly writes: Pick<StoreWrites, "settle" | "chargeLate">;
}

/** A Hold placed from a lease, or the reason none was. */
export type LeasePlacement =
  | { readonly kind: "held"; readonly holdId: string; readonly tokens: number }
  | { readonly kind: "revoked" }
  | { readonly kind: "none" };

/** What {@link Leases.confirm} found: the Hold's lease renewed, or lost (reclaimed by another replica). */
export type LeaseStanding =
  | { readonly kind: "current" }
  | {
      readonly kind: "lost";
      readonly keyId: string;
      /** What the Hold may still use beyond what the reclaim charged for it. */
      readonly uncoveredTokens: number;
      /** The lease's Budget period start (the Hold that takes over is placed in it); undefined without periods. */
      readonly periodStart: number | undefined;
    };

/** The lease side of a ledger: see `createLeases` (create-leases.ts). */
export interface Leases {
  /** Places a Hold from the key's lease (taking or topping one up when the Budget has room), or says none fits. */
  place(keyId: string, demand: HoldDemand): Promise<LeasePlacement>;
  /** True when holdId is (or was) a Hold of this replica's leases. */
  owns(holdId: string): boolean;
  renew(holdId: string, usedTokens: number, ttlMs: number): Promise<boolean>;
  /** `pending` when its write to the store (a moved Hold, a late charge) waits for the store. */
  settle(holdId: string, usedTokens: number): Promise<LedgerSettleResult>;
  /**
   * Whether a Hold may go on delivering without a look at the store: true for a Hold no longer
   * live here or moved into the store, and for one whose lease the store confirmed with more than a
   * quarter of its TTL to go. False once this replica went that long without a step (a stall, the
   * store unreachable): past the lease's expiry another replica may reclaim it and grant its tokens
   * again. Synchronous: asked before every chunk a stream delivers.
   */
  current(holdId: string): boolean;
  /**
   * Steps the Hold's lease (renewing it): `current`, or `lost` when another replica reclaimed it
   * meanwhile. Throws what the store throws (it cannot be reached: nothing is known).
   */
  confirm(holdId: string): Promise<LeaseStanding>;
  /** The Hold of a lost lease is taken over by `storeHoldId`, placed in the store for its uncovered tokens. */
  move(holdId: string, storeHoldId: string): boolean;
  /** Releases local Holds past their expiry (charging what their last renew recorded); returns how many. */
  reclaimLocal(): number;
  /** Gives back the free tokens of every lease on the key (a revoke on this replica). */
  drainKey(keyId: string): Promise<void>;
  /** Steps every lease now: charges flushed, renewed, drained, idle ones closed. */
  syncAll(): Promise<void>;
  /** Stops the timers, flushes every lease, returns its free tokens and closes the empty ones. */
  close(): Promise<void>;
  /** Live leases and local Holds, for tests and metrics. */
  stats(): { leases: number; holds: number; freeTokens: number };
}
