import type { HoldDemand } from "./plan-hold.js";

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
  /** The Budget: every token ever granted to the key. */
  readonly budgetTokens: number;
  /** Tokens charged by settled Holds. Never above budgetTokens. */
  readonly spentTokens: number;
  /** Allowed model ids, or null for every model. */
  readonly models: readonly string[] | null;
  readonly createdAt: number;
  /** When the key was revoked, or null while it is live. */
  readonly revokedAt: number | null;
}

/** A key with its live numbers, as {@link BudgetStore.keyUsage} reads them in one snapshot. */
export interface KeyUsageRecord extends KeyRecord {
  /** Σ tokens of the key's open Holds. */
  readonly heldTokens: number;
  /** Open Holds (requests in flight, or stale ones not yet reclaimed). */
  readonly openHolds: number;
  /** Holds settled so far (each one a finished request). */
  readonly settledHolds: number;
  /** Holds released by reclaim without a settle. */
  readonly reclaimedHolds: number;
}

/** The input of {@link BudgetStore.placeHold}. */
export interface PlaceHoldInput {
  readonly holdId: string;
  readonly keyId: string;
  readonly demand: HoldDemand;
  readonly instanceId: string;
  readonly now: number;
  readonly expiresAt: number;
}

/** The outcome of {@link BudgetStore.placeHold}. */
export type PlaceHoldOutcome =
  | { readonly kind: "held"; readonly tokens: number; readonly maxTokens: number; readonly clamped: boolean }
  | {
      readonly kind: "insufficient";
      /** The least the request could run with (prompt tokens + one token per choice). */
      readonly minimumTokens: number;
      readonly budgetTokens: number;
      readonly spentTokens: number;
      readonly heldTokens: number;
    }
  | { readonly kind: "revoked" }
  | { readonly kind: "unknown_key" };

/**
 * The outcome of a settle. `settled`: the Hold was open and is now charged. `settled_after_reclaim`:
 * the Hold had been reclaimed as stale; the charge is capped at what the Budget still has free.
 * `already_settled`: a repeated settle; nothing changed and nothing was charged.
 */
export interface SettleResult {
  readonly outcome: "settled" | "settled_after_reclaim" | "already_settled";
  /** Tokens charged to the Budget by this call (0 for `already_settled`). */
  readonly chargedTokens: number;
  /** Tokens of the Hold given back to the Budget by this call. */
  readonly releasedTokens: number;
}

/**
 * Where keys, Budgets and Holds live. Every method is one atomic step (one transaction), so that
 * several callers — threads, processes, or gateway replicas on a shared store — never overspend a
 * Budget. Methods are synchronous, as better-sqlite3 is; a store over the network would make this
 * interface async. Amounts are tokens (safe integers); times are Unix epoch milliseconds.
 */
export interface BudgetStore {
  /** Adds a key. Throws when the id or the hash already exists. */
  insertKey(record: KeyRecord): void;
  /** The key whose hash is `keyHash`, revoked or not. */
  findKeyByHash(keyHash: Uint8Array): KeyRecord | undefined;
  /** Every key, oldest first. */
  listKeys(): KeyRecord[];
  /** One key with its open/settled Hold numbers, or undefined for an unknown id. */
  keyUsage(keyId: string): KeyUsageRecord | undefined;
  /** Adds `tokens` to the Budget; false for an unknown id. */
  addBudget(keyId: string, tokens: number): boolean;
  /** Marks the key revoked at `now` (a second revoke keeps the first time); false for an unknown id. */
  revokeKey(keyId: string, now: number): boolean;
  /**
   * In one transaction: reads the Budget's free tokens (budget − spent − Σ open Holds), plans the
   * Hold with planHold, and inserts it when it fits.
   */
  placeHold(input: PlaceHoldInput): PlaceHoldOutcome;
  /** Moves an open Hold's expiry to `expiresAt`; false when the Hold is not open (or unknown). */
  renewHold(holdId: string, expiresAt: number): boolean;
  /**
   * Settles a Hold to `usedTokens`: charges min(usedTokens, held) and releases the rest, once.
   * Undefined for an unknown Hold id.
   */
  settleHold(holdId: string, usedTokens: number, now: number): SettleResult | undefined;
  /** Releases (charging nothing) every open Hold with expiresAt ≤ now; returns how many. */
  reclaimExpired(now: number): number;
  /**
   * Releases (charging nothing) every open Hold of `instanceId`, or every open Hold at all when
   * `instanceId` is undefined; returns how many.
   */
  reclaimOpen(now: number, instanceId?: string): number;
  /** Closes the store; later calls throw. */
  close(): void;
}
