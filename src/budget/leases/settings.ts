// How a replica leases: the options, their defaults, and how many tokens a new lease takes.
// src/budget/README.md, "Leases".
import { machineryDefaults } from "../../config/index.js";
import type { KeyState } from "../budget-store.js";

/** How a replica leases. Amounts are tokens; times are milliseconds. */
export interface LeaseOptions {
  /** Fraction of a key's free tokens one lease takes. @default 0.125 */
  readonly share?: number;
  /** Most tokens one lease takes. @default 10_000_000 */
  readonly maxTokens?: number;
  /**
   * A lease is taken only when it holds at least this many times the request that asks for it;
   * below that (the end of a Budget) every Hold is one transaction. @default 4
   */
  readonly minHolds?: number;
  /** A lease not renewed for this long is reclaimed by the other replicas. @default machineryDefaults.leaseTtlMs (30 s) */
  readonly ttlMs?: number;
  /** Charges settled from a lease reach the store (and the lease is renewed) this often. @default 1000 */
  readonly syncIntervalMs?: number;
  /** How often a replica looks for requests to give back its leases' free tokens. @default 100 */
  readonly drainPollMs?: number;
  /** Longest a request waits for other replicas to give back free tokens before its 429. @default 2000 */
  readonly drainWaitMs?: number;
  /** After a replica asked the others to drain, no new lease on that key for this long. @default 30_000 */
  readonly blockMs?: number;
  /** A lease that placed no Hold for this long gives its free tokens back and ends when empty. @default 5000 */
  readonly idleMs?: number;
}

/** {@link LeaseOptions} with every default filled in. */
export type LeaseSettings = Required<LeaseOptions>;

/** The defaults of {@link LeaseOptions}. */
export const DEFAULT_LEASE_SETTINGS: LeaseSettings = {
  share: 0.125,
  maxTokens: 10_000_000,
  minHolds: 4,
  ttlMs: machineryDefaults.leaseTtlMs,
  syncIntervalMs: 1000,
  drainPollMs: 100,
  drainWaitMs: 2000,
  blockMs: 30_000,
  idleMs: 5000,
};

/**
 * Tokens a new lease takes: `share` of the key's free tokens, at most `maxTokens`, and nothing
 * when that is less than `minHolds` requests of `need` tokens, when the key is revoked, or while
 * new leases on it are blocked (another replica asked for a drain). Pure.
 */
export function leaseGrant(free: number, key: KeyState, need: number, now: number, s: LeaseSettings): number {
  if (key.revokedAt !== null || now < key.leaseBlockUntil) return 0;
  const tokens = Math.min(s.maxTokens, Math.floor(free * s.share));
  return tokens >= need * s.minHolds ? tokens : 0;
}
