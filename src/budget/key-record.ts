// One key as a store keeps it (its own file: both the BudgetStore and its admin part use it).
import type { KeyMetadata, RateLimits } from "./key-settings.js";
import type { BudgetPeriod } from "./period.js";

/** One key as a store keeps it. Times are Unix epoch milliseconds; amounts are tokens. */
export interface KeyRecord {
  /** Public id, `key_` + 12 hex. */
  readonly id: string;
  /** SHA-256 of the key (32 bytes); the key itself is never stored. */
  readonly keyHash: Uint8Array;
  /** `acs-…` + the key's last 4 characters, for listings. */
  readonly hint: string;
  /** Free-form label, may be empty. */
  readonly name: string;
  /** The Budget: every token ever granted to the key (of each period, when it has one). */
  readonly budgetTokens: number;
  /**
   * Tokens charged so far (in the current period, when the key has one). spent + held + leased ≤
   * budget, always (a CHECK in both stores).
   */
  readonly spentTokens: number;
  /** How often `spent` starts again from 0 (period.ts). Absent on insert: `none`; reads always set it. */
  readonly period?: BudgetPeriod;
  /**
   * Start of the key's current period as last rolled over (Unix epoch ms; 0 for `none`); on insert,
   * `periodStart(period, createdAt)` when absent. Reads always set it.
   */
  readonly periodStart?: number;
  /** Allowed model ids, or null for every model. */
  readonly models: readonly string[] | null;
  readonly createdAt: number;
  /** When the key was revoked, or null while it is live. */
  readonly revokedAt: number | null;
  /** Rate limits (stored and returned; src/ratelimit enforces them); null or absent: none. */
  readonly rateLimits?: RateLimits | null;
  /** When the key stops working (Unix epoch ms); null or absent: never. */
  readonly expiresAt?: number | null;
  /** Admin metadata (≤ 16 pairs); null or absent: none. */
  readonly metadata?: KeyMetadata | null;
}
