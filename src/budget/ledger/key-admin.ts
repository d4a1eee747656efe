// Administering keys (the keys CLI, tests): create, list, grant, revoke, and a key's usage.
import { apiKeyHint, generateApiKey, generateKeyId, hashApiKey } from "../api-key.js";
import type { KeyRecord, KeyUsageRecord, PeriodRecord } from "../budget-store.js";
import { isBudgetPeriod, nextBoundary, periodStart } from "../period.js";
import type { BudgetLedger, CreatedKey, KeySummary, KeyUsage } from "./api.js";
import { checkInt, UnknownIdError } from "./errors.js";
import { waitForDrains } from "./holds.js";
import type { LedgerState } from "./state.js";

/** `BudgetLedger.createKey`: a new key and its record in the store. */
export async function createKey(
  l: LedgerState,
  input: Parameters<BudgetLedger["createKey"]>[0],
): Promise<CreatedKey> {
  const { store, now } = l;
  checkInt("budgetTokens", input.budgetTokens, 0);
  const period = input.period ?? "none";
  if (!isBudgetPeriod(period))
    throw new RangeError(`period: none, day, week or month, not ${String(period)}`);
  const models = input.models === undefined ? null : [...new Set(input.models)];
  if (models?.some((m) => m === "")) throw new RangeError("models: a model id must not be empty");
  const key = generateApiKey();
  const id = generateKeyId();
  await store.insertKey({
    id,
    keyHash: hashApiKey(key),
    hint: apiKeyHint(key),
    name: input.name ?? "",
    budgetTokens: input.budgetTokens,
    spentTokens: 0,
    models,
    createdAt: now(),
    revokedAt: null,
    period,
  });
  return { id, key };
}

/** `BudgetLedger.listKeys`: every key, oldest first. */
export async function listKeys(l: LedgerState): Promise<KeySummary[]> {
  const t = l.now();
  return (await l.store.listKeys()).map((k) => toSummary(asOf(k, t).record));
}

/** `BudgetLedger.grant`: adds tokens (integer ≥ 1) to the key's Budget; UnknownIdError for an unknown key. */
export async function grant(l: LedgerState, id: string, tokens: number): Promise<KeyUsage> {
  checkInt("tokens", tokens, 1);
  if (!(await l.store.addBudget(id, tokens))) throw new UnknownIdError("key", id);
  return mustKnowKey(l, id);
}

/** `BudgetLedger.revoke`: revokes the key, forgets it in the cache and has its leases back. */
export async function revoke(l: LedgerState, id: string): Promise<KeySummary> {
  const { store, now, authCache, leases } = l;
  if (!(await store.revokeKey(id, now()))) throw new UnknownIdError("key", id);
  for (const [hash, entry] of authCache) if (entry.record.id === id) authCache.delete(hash);
  await leases?.drainKey(id);
  await waitForDrains(l, id);
  return toSummary(await mustKnowKey(l, id));
}

/** The key's usage (days: see `BudgetLedger.usage`); UnknownIdError for an unknown key. */
export async function mustKnowKey(l: LedgerState, id: string, days?: number): Promise<KeyUsage> {
  const { store } = l;
  const usage = await store.keyUsage(id, days);
  if (usage === undefined) throw new UnknownIdError("key", id);
  const { record, ended } = asOf(usage, l.now());
  const periods = ended === undefined ? usage.periods : [ended, ...usage.periods];
  return toUsage({ ...usage, ...record, periods });
}

/**
 * A key record as of `t`: when its period ended since the store last rolled it over (no
 * transaction on the key since the boundary), the numbers of the period of `t` — spent 0, held
 * and leased 0 (what is still held counts in the period that ended) — and that period's record.
 */
function asOf<K extends KeyRecord & { heldTokens?: number; leasedTokens?: number }>(
  k: K,
  t: number,
): { record: K; ended?: PeriodRecord } {
  const period = k.period ?? "none";
  const start = k.periodStart ?? 0;
  const end = nextBoundary(period, start);
  if (end === 0 || t < end) return { record: k };
  const ended: PeriodRecord = {
    periodStart: start,
    periodEnd: end,
    budgetTokens: k.budgetTokens,
    spentTokens: k.spentTokens,
    heldTokens: k.heldTokens ?? 0,
    leasedTokens: k.leasedTokens ?? 0,
  };
  const now = { spentTokens: 0, heldTokens: 0, leasedTokens: 0, periodStart: periodStart(period, t) };
  return { record: { ...k, ...now }, ended };
}

/** What admins see of a key record (its period's fields only when it has one). */
function toSummary(record: Omit<KeyRecord, "keyHash">): KeySummary {
  const period = record.period ?? "none";
  const start = record.periodStart ?? 0;
  return {
    id: record.id,
    name: record.name,
    hint: record.hint,
    budgetTokens: record.budgetTokens,
    spentTokens: record.spentTokens,
    models: record.models,
    createdAt: record.createdAt,
    revokedAt: record.revokedAt,
    ...(period === "none" ? {} : { period, periodStart: start, resetsAt: nextBoundary(period, start) }),
  };
}

function toUsage(record: KeyUsageRecord): KeyUsage {
  return {
    ...toSummary(record),
    heldTokens: record.heldTokens,
    leasedTokens: record.leasedTokens,
    availableTokens: record.budgetTokens - record.spentTokens - record.heldTokens - record.leasedTokens,
    openHolds: record.openHolds,
    leases: record.leases,
    settledHolds: record.settledHolds,
    reclaimedHolds: record.reclaimedHolds,
    daily: record.daily,
    ...((record.period ?? "none") === "none" ? {} : { periods: record.periods }),
  };
}
