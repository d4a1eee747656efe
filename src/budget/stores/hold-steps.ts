// The Hold transactions of a BudgetStore, written once for every backend: placeHold (planHold on
// the key's free tokens, the drain of other replicas' leases), settleHold and chargeLate. With
// SQLite's shortcuts (TxRows.shortcuts) the common cases are one statement each. Each rolls the
// key over to its current period first (./periods.ts); a Hold of a past period settles to it.
import type { LateChargeInput, PlaceHoldInput, PlaceHoldOutcome, SettleResult } from "../budget-store.js";
import { checkDemand, demandTokens, planHold } from "../plan-hold.js";
import type { StoreBackend, TxRows } from "./backend.js";
import { countersOf, freeIn, rollover } from "./periods.js";

/** Inserts the Hold of a placeHold input, of `tokens`, in a period (the counters are the caller's to update). */
function insertHold(rows: TxRows, input: PlaceHoldInput, tokens: number, periodStart: number): void {
  rows.insertHold({
    id: input.holdId,
    keyId: input.keyId,
    tokens,
    createdAt: input.now,
    expiresAt: input.expiresAt,
    instanceId: input.instanceId,
    periodStart,
  });
}

/** Settles a Hold of keyId, the key row locked first then the Hold's. */
async function settleLocked(
  rows: TxRows,
  keyId: string,
  holdId: string,
  usedTokens: number,
  now: number,
  day: string,
): Promise<SettleResult | undefined> {
  const [locked, hold] = await Promise.all([rows.lockKey(keyId), rows.lockHold(holdId)]);
  if (locked === undefined || hold === undefined) return undefined;
  const key = rollover(rows, locked, now);
  if (hold.state === "settled") return { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
  // The period the Hold was placed in: its charge counts there (a past one's unused tokens go back nowhere).
  const c = await countersOf(rows, key, hold.periodStart);
  const wanted = Math.min(usedTokens, hold.tokens);
  if (hold.state === "open") {
    rows.closeHold(holdId, "settled", usedTokens, wanted, now);
    c.write(c.spent + wanted, c.held - hold.tokens, c.leased);
    rows.addDaily(keyId, day, wanted, 1, 0);
    return { outcome: "settled", chargedTokens: wanted, releasedTokens: hold.tokens - wanted };
  }
  // Reclaimed as stale (charged what its last renewal recorded), then settled late: the rest
  // of its tokens went back to the Budget and may be held by other requests since, so the
  // rest of its charge is capped at what is still free.
  const extra = Math.min(Math.max(0, wanted - hold.chargedTokens), Math.max(0, freeIn(c)));
  rows.closeHold(holdId, "settled", usedTokens, hold.chargedTokens + extra, now);
  c.write(c.spent + extra, c.held, c.leased);
  rows.addDaily(keyId, day, extra, 1, 0);
  return { outcome: "settled_after_reclaim", chargedTokens: extra, releasedTokens: 0 };
}

/** {@link BudgetStore.placeHold} inside its transaction. */
export async function placeHoldIn(rows: TxRows, input: PlaceHoldInput): Promise<PlaceHoldOutcome> {
  if (rows.shortcuts !== undefined && input.periodStart === undefined) {
    // The demand fits whole: what planHold answers when need ≤ available, in one statement.
    checkDemand(input.demand);
    const need = demandTokens(input.demand);
    const periodStart = rows.shortcuts.reserve(input.keyId, need, input.now);
    if (periodStart !== undefined) {
      insertHold(rows, input, need, periodStart);
      return { kind: "held", tokens: need, maxTokens: input.demand.maxTokens, clamped: false };
    }
  }
  const locked = await rows.lockKey(input.keyId);
  if (locked === undefined) return { kind: "unknown_key" };
  if (locked.revokedAt !== null) return { kind: "revoked" };
  if (locked.expiresAt != null && locked.expiresAt <= input.now)
    return { kind: "expired", expiresAt: locked.expiresAt };
  const key = rollover(rows, locked, input.now);
  const periodStart = input.periodStart ?? key.periodStart;
  const c = await countersOf(rows, key, periodStart);
  const plan = planHold(freeIn(c), input.demand);
  if (plan.kind === "count") return { kind: "count" };
  if ((plan.kind === "insufficient" || plan.clamped) && input.drainOthersUntil !== undefined && c.current) {
    // Other replicas' leases may hold free tokens: have them back before clamping or refusing.
    const others = { instanceId: input.instanceId, now: input.now, periodStart };
    const leases = await rows.flagDrain(input.keyId, others);
    if (leases > 0) {
      rows.blockLeases(input.keyId, input.drainOthersUntil);
      return { kind: "drain_requested", leases };
    }
  }
  if (plan.kind === "insufficient") {
    return {
      kind: "insufficient",
      minimumTokens: plan.minimumTokens,
      budgetTokens: c.budget,
      spentTokens: c.spent,
      heldTokens: c.held + c.leased,
    };
  }
  insertHold(rows, input, plan.tokens, periodStart);
  c.write(c.spent, c.held + plan.tokens, c.leased);
  return { kind: "held", tokens: plan.tokens, maxTokens: plan.maxTokens, clamped: plan.clamped };
}

/**
 * {@link BudgetStore.settleHold} inside a transaction of a backend with shortcuts: an open Hold
 * settled in one statement, any other by {@link settleLocked}.
 */
async function settleShortcutIn(
  rows: TxRows,
  holdId: string,
  usedTokens: number,
  now: number,
  day: string,
): Promise<SettleResult | undefined> {
  const s = rows.shortcuts;
  const open = s?.settleOpen(holdId, usedTokens, now);
  if (s !== undefined && open !== undefined) {
    // What settleLocked does with an open Hold, the Hold's row already settled.
    s.moveHeld(open.keyId, open.charged, open.tokens);
    rows.addDaily(open.keyId, day, open.charged, 1, 0);
    return {
      outcome: "settled",
      chargedTokens: open.charged,
      releasedTokens: open.tokens - open.charged,
    };
  }
  const hold = await rows.lockHold(holdId);
  return hold === undefined ? undefined : settleLocked(rows, hold.keyId, holdId, usedTokens, now, day);
}

/**
 * {@link BudgetStore.settleHold}: one transaction; without shortcuts the Hold's key is read first
 * (no lock) so that the transaction locks the key row before the Hold's.
 */
export async function settleHold(
  backend: StoreBackend,
  holdId: string,
  usedTokens: number,
  now: number,
  day: string,
): Promise<SettleResult | undefined> {
  if (backend.shortcuts) {
    return backend.transaction((rows) => settleShortcutIn(rows, holdId, usedTokens, now, day));
  }
  const keyId = await backend.holdKeyId(holdId);
  if (keyId === undefined) return undefined;
  return backend.transaction((rows) => settleLocked(rows, keyId, holdId, usedTokens, now, day));
}

/** {@link BudgetStore.chargeLate} inside its transaction: returns the tokens charged. */
export async function chargeLateIn(rows: TxRows, input: LateChargeInput): Promise<number> {
  const { keyId, holdId, tokens, now, day } = input;
  const locked = await rows.lockKey(keyId);
  if (locked === undefined) return 0;
  const key = rollover(rows, locked, now);
  // Written before: a retry whose first answer was lost charges nothing.
  if ((await rows.lockHold(holdId)) !== undefined) return 0;
  const periodStart = input.periodStart ?? key.periodStart;
  const c = await countersOf(rows, key, periodStart);
  const charged = Math.min(tokens, Math.max(0, freeIn(c)));
  c.write(c.spent + charged, c.held, c.leased);
  rows.addDaily(keyId, day, charged, 1, 0);
  // The charge's record: a closed Hold row of that id (purged after the retention, as any).
  const held = Math.max(1, tokens);
  rows.insertHold({
    id: holdId,
    keyId,
    tokens: held,
    createdAt: now,
    expiresAt: now,
    instanceId: input.instanceId,
    periodStart,
  });
  rows.closeHold(holdId, "settled", tokens, charged, now);
  return charged;
}
