// Placing a Hold: on this replica's lease when it has room, else in one transaction of the
// store (after other replicas gave back their leases' free tokens, when that is what it takes).
import { generateHoldId } from "../api-key.js";
import type { PlaceHoldInput, PlaceHoldOutcome } from "../budget-store.js";
import type { Leases } from "../leases/api.js";
import { checkDemand, type HoldDemand } from "../plan-hold.js";
import type { CountNeeded, KeyInfo, PlacedHold } from "./api.js";
import { expiredKey, incorrectKey, insufficientQuota, revokedKey, storeUnavailable } from "./errors.js";
import type { LedgerState } from "./state.js";

/** What {@link placeInStore} placed, or why not: the Hold's id and the expiry it was given (Unix epoch ms). */
export interface PlacedInStore {
  readonly holdId: string;
  readonly outcome: Exclude<PlaceHoldOutcome, { kind: "drain_requested" }>;
  readonly expiresAt: number;
}

/** `BudgetLedger.placeHold`: on a lease when it can, else in the store (see {@link heldInStore}). */
export async function placeHold(
  l: LedgerState,
  key: KeyInfo,
  demand: HoldDemand,
): Promise<PlacedHold | CountNeeded> {
  const { leases, writes } = l;
  checkDemand(demand);
  // The expiry as authenticate read it (at most the auth cache's TTL old); the store checks it again.
  if (key.expiresAt !== undefined && key.expiresAt <= l.now()) throw expiredKey(key.hint, key.expiresAt);
  if (leases !== undefined) {
    let placed: Awaited<ReturnType<Leases["place"]>>;
    try {
      placed = await leases.place(key.id, demand);
    } catch (err) {
      throw storeUnavailable(err, "no Hold could be placed on the key's Budget");
    }
    if (placed.kind === "held") {
      return {
        holdId: placed.holdId,
        maxTokens: demand.maxTokens,
        clamped: false,
        heldTokens: placed.tokens,
      };
    }
    if (placed.kind === "revoked") throw revokedKey(key.hint);
  }
  if (writes.full) {
    throw storeUnavailable(
      new Error(`${writes.pendingSettles} settles wait for the Budget store`),
      "no Hold could be placed on the key's Budget",
    );
  }
  let placedInStore: PlacedInStore;
  try {
    placedInStore = await placeInStore(l, key.id, demand);
  } catch (err) {
    throw storeUnavailable(err, "no Hold could be placed on the key's Budget");
  }
  return heldInStore(l, key, demand, placedInStore);
}

/** The answer of a placeHold for a Hold placed in the store: the Hold, or the refusal it throws. */
function heldInStore(
  l: LedgerState,
  key: KeyInfo,
  demand: HoldDemand,
  placedInStore: PlacedInStore,
): PlacedHold | CountNeeded {
  const { storeHolds, holdTtlMs } = l;
  const { holdId, outcome, expiresAt } = placedInStore;
  switch (outcome.kind) {
    case "held":
      storeHolds.set(holdId, { expiresAt, ttlMs: holdTtlMs, lost: false });
      return {
        holdId,
        maxTokens: outcome.maxTokens,
        clamped: outcome.clamped,
        heldTokens: outcome.tokens,
      };
    case "insufficient":
      throw insufficientQuota(outcome, demand);
    case "count":
      return { countNeeded: true };
    case "revoked":
      throw revokedKey(key.hint);
    case "expired":
      throw expiredKey(key.hint, outcome.expiresAt);
    case "unknown_key":
      throw incorrectKey(null);
  }
}

/**
 * A Hold in the store, in one transaction (after other replicas gave back their leases' free
 * tokens when it would clamp or refuse); in the Budget period starting at `periodStart` when
 * given (PlaceHoldInput.periodStart), else the key's current one.
 */
export async function placeInStore(
  l: LedgerState,
  keyId: string,
  demand: HoldDemand,
  periodStart?: number,
): Promise<PlacedInStore> {
  const { now, instanceId, holdTtlMs, settings, store } = l;
  const t = now();
  const input: PlaceHoldInput = {
    holdId: generateHoldId(),
    keyId,
    demand,
    instanceId,
    now: t,
    expiresAt: t + holdTtlMs,
    drainOthersUntil: t + settings.blockMs,
    ...(periodStart === undefined ? {} : { periodStart }),
  };
  let outcome = await store.placeHold(input);
  let { expiresAt } = input;
  if (outcome.kind === "drain_requested") {
    // Other replicas lease tokens of this key: have their free tokens back, then plan once more.
    await waitForDrains(l, keyId);
    const t2 = now();
    const { drainOthersUntil: _, ...again } = input;
    expiresAt = t2 + holdTtlMs;
    outcome = await store.placeHold({ ...again, now: t2, expiresAt });
  }
  if (outcome.kind === "drain_requested") {
    throw new Error("unreachable: a placeHold without drainOthersUntil asked for a drain");
  }
  return { holdId: input.holdId, outcome, expiresAt };
}

/** Waits until no live lease of another replica is still asked to drain on the key (bounded). */
export async function waitForDrains(l: LedgerState, keyId: string): Promise<void> {
  const { settings, store, now, instanceId } = l;
  const until = Date.now() + settings.drainWaitMs;
  const pause = Math.max(5, Math.min(25, Math.floor(settings.drainPollMs / 2)));
  while (Date.now() < until && (await store.drainsPending(keyId, now(), instanceId)) > 0) {
    await new Promise((r) => setTimeout(r, pause));
  }
}
