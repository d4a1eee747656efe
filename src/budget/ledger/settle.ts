// Ending a Hold: on its lease, or written to the store (kept and written again while it fails).
import type { LedgerSettleResult } from "../store-writes.js";
import { checkInt, UnknownIdError } from "./errors.js";
import type { LedgerState } from "./state.js";

/** `BudgetLedger.settle`: on the Hold's lease, or written to the store (kept while it fails). */
export async function settle(
  l: LedgerState,
  holdId: string,
  usedTokens: number,
): Promise<LedgerSettleResult> {
  const { storeHolds, leases, writes } = l;
  checkInt("usedTokens", usedTokens, 0);
  storeHolds.delete(holdId);
  if (leases?.owns(holdId) === true) return leases.settle(holdId, usedTokens);
  const result = await writes.settle(holdId, usedTokens);
  if (result === undefined) throw new UnknownIdError("hold", holdId);
  return result;
}
