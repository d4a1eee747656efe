// The state of one replica's leases: its leases by key, its local Holds and what closed ones
// left, and the few helpers that find, start and retire a lease. Behaviour is in the sibling
// files (step.ts, place.ts, local-holds.ts, confirm.ts, sync.ts).
import { generateKeyId } from "../api-key.js";
import type { BudgetStore, LeaseSyncInput } from "../budget-store.js";
import type { LeaseDeps } from "./api.js";
import type { LeaseSettings } from "./settings.js";

/** A Hold placed in memory against a lease. */
export interface LocalHold {
  readonly id: string;
  readonly lease: Lease;
  readonly tokens: number;
  /** Tokens used as recorded by the last renew (what a reclaim charges for it). */
  recorded: number;
  /** `recorded` as of the last step the store applied (what a reclaim of the lease would charge). */
  confirmed: number;
  expiresAt: number;
  /**
   * The Hold in the store that took it over after its lease was lost (`Leases.move`): it
   * holds what this Hold may use beyond `confirmed` (the reclaim charged `confirmed`).
   */
  moved: string | undefined;
}

/** A lease as this replica keeps it: tokens = free + held + pendingCharge (+ a step in flight). */
export interface Lease {
  readonly id: string;
  readonly keyId: string;
  /** Last step sent. */
  seq: number;
  free: number;
  held: number;
  /** Σ recorded over the live Holds. */
  floor: number;
  pendingCharge: number;
  /** Σ over the Holds in pendingCharge of charge − confirmed (due if the lease turns out lost). */
  pendingChargeIfLost: number;
  pendingSettled: number;
  readonly holds: Set<LocalHold>;
  /** Holds renewed since the last step was sent, with the value that step records. */
  dirty: Map<LocalHold, number>;
  /** Takes no new Holds; gives its free tokens back at each step, ends once empty (drained, idle, low, revoked). */
  closing: boolean;
  /** The key is revoked (refuse at once). */
  revoked: boolean;
  /** Reclaimed by another replica: every Hold on it ends with a late charge. */
  lost: boolean;
  closed: boolean;
  /** The store's expiry as last confirmed. */
  expiresAt: number;
  /**
   * The lease's Budget period as the store answered it (src/budget/README.md "Budget periods"):
   * its start (what a late charge of its Holds names; undefined for a key without periods) and its
   * end, from which no Hold is placed on it (0: never).
   */
  periodStart: number | undefined;
  periodEnd: number;
  /** The store rolled the key over past the lease's period (the lease is closing). */
  periodOver: boolean;
  lastPlacedAt: number;
  /** A step sent whose outcome is unknown: it is sent again (same seq) before anything else. */
  unconfirmed: { input: LeaseSyncInput; dirty: Map<LocalHold, number> } | undefined;
  /** The running or last step (steps of one lease run one at a time). */
  chain: Promise<unknown>;
  /** A plain step queued behind the running one, not started yet (later plain steps join it). */
  again: Promise<void> | undefined;
}

/** What a closed local Hold left, for a repeated or late settle. */
export interface Tombstone {
  readonly keyId: string;
  readonly state: "settled" | "reclaimed";
  /** Tokens already charged for it (a reclaim's recorded use). */
  readonly charged: number;
  readonly tokens: number;
  /** Its lease's period start (undefined for a key without periods). */
  readonly periodStart: number | undefined;
}

/** Tombstones kept at most (the oldest is dropped past it). */
export const TOMBSTONES = 100_000;

/** One key's leases: the one taking Holds, and older ones still holding some. */
export interface KeyLeases {
  current: Lease | undefined;
  readonly retired: Set<Lease>;
  /** The slow path of the key (taking or topping up a lease) runs one at a time within this replica. */
  lock: Promise<unknown>;
  /** Until then (Unix epoch ms) no new lease is tried: the last try granted nothing. */
  noLeaseUntil: number;
}

/**
 * What the functions of one replica's leases share: the dependencies and the settings (with
 * `syncIntervalMs` clamped, see `leaseState`), the maps, and the flags of its two timers.
 */
export interface LeasesState {
  readonly deps: LeaseDeps;
  readonly store: BudgetStore;
  readonly instanceId: string;
  /** The clock, Unix epoch ms (`deps.now`). */
  readonly now: () => number;
  readonly s: LeaseSettings;
  /** Per key: the lease taking Holds, and older ones still holding some. */
  readonly byKey: Map<string, KeyLeases>;
  /** Live local Holds by id. */
  readonly holds: Map<string, LocalHold>;
  /** Closed local Holds by id, oldest first, at most {@link TOMBSTONES}. */
  readonly tombstones: Map<string, Tombstone>;
  /** Set by close(): no lease is taken or topped up any more. */
  closing: boolean;
  /** A syncAll of the sync timer is running (the timer skips its turn). */
  syncing: boolean;
  /** A pollDrains of the drain timer is running (the timer skips its turn). */
  polling: boolean;
}

/** The state of a new set of leases (no lease yet); timers are started by `createLeases`. */
export function leaseState(deps: LeaseDeps): LeasesState {
  const { store, instanceId, now } = deps;
  // A lease is renewed at the step after half its life is gone: steps come at least 8 times a
  // life, so that a lease renewed on schedule keeps more than a quarter of it (what `current`
  // asks) at every moment.
  const s: LeaseSettings = {
    ...deps.settings,
    syncIntervalMs: Math.max(1, Math.min(deps.settings.syncIntervalMs, Math.floor(deps.settings.ttlMs / 8))),
  };
  return {
    deps,
    store,
    instanceId,
    now,
    s,
    byKey: new Map(),
    holds: new Map(),
    tombstones: new Map(),
    closing: false,
    syncing: false,
    polling: false,
  };
}

/** The key's entry, made empty when it has none. */
export function entryOf(st: LeasesState, keyId: string): KeyLeases {
  let e = st.byKey.get(keyId);
  if (e === undefined) {
    e = { current: undefined, retired: new Set(), lock: Promise.resolve(), noLeaseUntil: 0 };
    st.byKey.set(keyId, e);
  }
  return e;
}

/** Every lease of this replica: each key's current one, then its retired ones. */
export function* allLeases(st: LeasesState): Generator<Lease> {
  for (const e of st.byKey.values()) {
    if (e.current) yield e.current;
    yield* e.retired;
  }
}

/**
 * True for a lease that takes new Holds: open, not revoked, more than a quarter of its TTL ahead,
 * and its Budget period not over by this ledger's clock (a Hold placed after the boundary is the
 * next period's: it goes on a new lease).
 */
export function usable(st: LeasesState, l: Lease | undefined): l is Lease {
  const { now, s } = st;
  if (l === undefined || l.closing || l.lost || l.closed || l.revoked) return false;
  const t = now();
  return t < l.expiresAt - s.ttlMs / 4 && (l.periodEnd === 0 || t < l.periodEnd);
}

/** A lease of the key not yet in the store (its first step takes its tokens). */
export function newLease(st: LeasesState, keyId: string): Lease {
  const { now } = st;
  return {
    id: `lease_${generateKeyId().slice(4)}${generateKeyId().slice(4)}`,
    keyId,
    seq: 0,
    free: 0,
    held: 0,
    floor: 0,
    pendingCharge: 0,
    pendingChargeIfLost: 0,
    pendingSettled: 0,
    holds: new Set(),
    dirty: new Map(),
    closing: false,
    revoked: false,
    lost: false,
    closed: false,
    expiresAt: 0,
    periodStart: undefined,
    periodEnd: 0,
    periodOver: false,
    lastPlacedAt: now(),
    unconfirmed: undefined,
    chain: Promise.resolve(),
    again: undefined,
  };
}

/** Drops the lease from its key's entry (it is closed or lost). */
export function forget(st: LeasesState, lease: Lease): void {
  const e = st.byKey.get(lease.keyId);
  if (e === undefined) return;
  if (e.current === lease) e.current = undefined;
  e.retired.delete(lease);
}

/** Marks the lease closing and moves it to its key's retired leases. */
export function retire(st: LeasesState, lease: Lease): void {
  lease.closing = true;
  const e = entryOf(st, lease.keyId);
  if (e.current === lease) e.current = undefined;
  e.retired.add(lease);
}
