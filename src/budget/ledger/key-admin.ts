// Administering keys (the keys CLI and the admin API, one implementation): create, get, list,
// update, grant, rotate, revoke, and a key's usage. Every change is one transaction of the store
// with its audit row (actor: the admin key id, or `cli`).

import type { AuditStamp, KeyPatch, Page } from "../admin-store.js";
import { apiKeyHint, generateApiKey, generateAuditId, generateKeyId, hashApiKey } from "../api-key.js";
import type { KeyRecord, KeyUsageRecord, PeriodRecord } from "../budget-store.js";
import { checkExpiresAt, checkMetadata, checkRateLimits, KeySettingError } from "../key-settings.js";
import { isBudgetPeriod, nextBoundary, periodStart } from "../period.js";
import type { BudgetLedger, CreatedKey, KeyChanges, KeySettings, KeySummary, KeyUsage } from "./api.js";
import { checkInt, UnknownIdError } from "./errors.js";
import { waitForDrains } from "./holds.js";
import type { LedgerState } from "./state.js";

/** The actor of a change made without an admin key: the keys CLI (and code that calls the ledger). */
export const CLI_ACTOR = "cli";

/** Most items of one page of a list. */
export const MAX_PAGE_LIMIT = 100;

/** The stamp of an audit row written now. */
export function stamp(l: LedgerState, actor: string, action: string): AuditStamp {
  return { id: generateAuditId(), at: l.now(), actor, action };
}

/** Throws KeySettingError unless the settings pass their checks (ranges, caps, non-empty model ids). */
function checkSettings(s: KeySettings): void {
  if (s.rateLimits != null) checkRateLimits(s.rateLimits);
  if (s.metadata != null) checkMetadata(s.metadata);
  if (s.expiresAt !== undefined) checkExpiresAt(s.expiresAt);
  if (s.models?.some((m) => m === "")) {
    throw new KeySettingError("models", "A model id must not be empty.");
  }
}

/** `BudgetLedger.createKey`: a new key, its record and its audit row in the store. */
export async function createKey(
  l: LedgerState,
  input: Parameters<BudgetLedger["createKey"]>[0],
  actor = CLI_ACTOR,
): Promise<CreatedKey & KeySummary> {
  const { store, now } = l;
  checkInt("budgetTokens", input.budgetTokens, 0);
  checkSettings(input);
  const period = input.period ?? "none";
  if (!isBudgetPeriod(period))
    throw new RangeError(`period: none, day, week or month, not ${String(period)}`);
  const models = input.models == null ? null : [...new Set(input.models)];
  const key = generateApiKey();
  const record: KeyRecord = {
    id: generateKeyId(),
    keyHash: hashApiKey(key),
    hint: apiKeyHint(key),
    name: input.name ?? "",
    budgetTokens: input.budgetTokens,
    spentTokens: 0,
    models,
    createdAt: now(),
    revokedAt: null,
    rateLimits: input.rateLimits ?? null,
    expiresAt: input.expiresAt ?? null,
    metadata: input.metadata ?? null,
    period,
  };
  await store.createKeyAudited(record, stamp(l, actor, "api_key.created"));
  return { ...toSummary(record), key };
}

/** `BudgetLedger.getKey`; UnknownIdError for an unknown key. */
export async function getKey(l: LedgerState, id: string): Promise<KeySummary> {
  const record = await l.store.getKey(id);
  if (record === undefined) throw new UnknownIdError("key", id);
  return toSummary(asOf(record, l.now()).record);
}

/** `BudgetLedger.listKeys`: every key, oldest first. */
export async function listKeys(l: LedgerState): Promise<KeySummary[]> {
  const t = l.now();
  return (await l.store.listKeys()).map((k) => toSummary(asOf(k, t).record));
}

/** RangeError unless the page's limit is 1–100. */
export function checkLimit(limit: number): void {
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_PAGE_LIMIT) {
    throw new KeySettingError(
      "limit",
      `Invalid value for 'limit': expected an integer from 1 to ${MAX_PAGE_LIMIT}, got ${limit}.`,
    );
  }
}

/** `BudgetLedger.listKeysPage`: newest first; KeySettingError (param `after`) for an unknown cursor. */
export async function listKeysPage(
  l: LedgerState,
  page: { after?: string; limit: number },
): Promise<Page<KeySummary>> {
  checkLimit(page.limit);
  const found = await l.store.listKeysPage(page);
  if (found === undefined)
    throw new KeySettingError("after", `Invalid value for 'after': no key with id '${page.after}'.`);
  const t = l.now();
  return { items: found.items.map((k) => toSummary(asOf(k, t).record)), hasMore: found.hasMore };
}

/**
 * One audited change of a key: the patch planned from the locked key. Throws UnknownIdError for
 * an unknown key, KeySettingError when the plan refuses it.
 */
async function change(
  l: LedgerState,
  id: string,
  actor: string,
  action: string,
  plan: Parameters<LedgerState["store"]["changeKey"]>[0]["plan"],
): Promise<{ before: KeyRecord; after: KeyRecord }> {
  const outcome = await l.store.changeKey({ keyId: id, audit: stamp(l, actor, action), plan });
  if (outcome.kind === "unknown_key") throw new UnknownIdError("key", id);
  if (outcome.kind === "refused") throw outcome.error;
  return outcome;
}

/** Forgets the key in this replica's auth cache: its next request reads the store. */
function forget(l: LedgerState, id: string): void {
  for (const [token, entry] of l.authCache) if (entry.record.id === id) l.authCache.delete(token);
}

/** `BudgetLedger.updateKey`: the changes asked for, in one audited transaction. */
export async function updateKey(
  l: LedgerState,
  id: string,
  changes: KeyChanges,
  actor = CLI_ACTOR,
): Promise<KeySummary> {
  checkSettings(changes);
  if (changes.budgetTokens !== undefined) checkInt("budgetTokens", changes.budgetTokens, 0);
  if (changes.addTokens !== undefined) checkInt("addTokens", changes.addTokens, 1);
  const { after } = await change(l, id, actor, "api_key.updated", (key) => {
    const patch: { -readonly [K in keyof KeyPatch]: KeyPatch[K] } = {};
    if (changes.name !== undefined) patch.name = changes.name;
    if (changes.models !== undefined)
      patch.models = changes.models === null ? null : [...new Set(changes.models)];
    if (changes.rateLimits !== undefined) patch.rateLimits = changes.rateLimits;
    if (changes.expiresAt !== undefined) patch.expiresAt = changes.expiresAt;
    if (changes.metadata !== undefined) patch.metadata = changes.metadata;
    const base = changes.budgetTokens ?? key.budgetTokens;
    if (changes.budgetTokens !== undefined || changes.addTokens !== undefined) {
      patch.budgetTokens = base + (changes.addTokens ?? 0);
      if (!Number.isSafeInteger(patch.budgetTokens)) {
        throw new KeySettingError(
          "add_budget_tokens",
          `Invalid value for 'add_budget_tokens': the Budget would be ${base} + ${changes.addTokens} tokens, past 2^53 − 1.`,
        );
      }
    }
    return patch;
  });
  forget(l, id);
  return toSummary(after);
}

/** `BudgetLedger.grant`: adds tokens (integer ≥ 1) to the key's Budget; UnknownIdError for an unknown key. */
export async function grant(
  l: LedgerState,
  id: string,
  tokens: number,
  actor = CLI_ACTOR,
): Promise<KeyUsage> {
  checkInt("tokens", tokens, 1);
  await updateKey(l, id, { addTokens: tokens }, actor);
  return mustKnowKey(l, id);
}

/**
 * `BudgetLedger.rotateKey`: a new secret for the same key id (its Budget, spent and usage kept).
 * The old secret is refused at once on this replica (forgotten in its auth cache), and on the
 * others once their cache entry is older than the auth cache's TTL (1 s).
 */
export async function rotateKey(
  l: LedgerState,
  id: string,
  actor = CLI_ACTOR,
): Promise<CreatedKey & KeySummary> {
  const key = generateApiKey();
  const { after } = await change(l, id, actor, "api_key.rotated", (k) =>
    k.revokedAt !== null
      ? new KeySettingError("id", `The key '${id}' is revoked: a revoked key cannot be rotated.`)
      : { keyHash: hashApiKey(key), hint: apiKeyHint(key) },
  );
  forget(l, id);
  return { ...toSummary(after), key };
}

/** `BudgetLedger.revoke`: revokes the key (audited), forgets it in the cache and has its leases back. */
export async function revoke(l: LedgerState, id: string, actor = CLI_ACTOR): Promise<KeySummary> {
  const { leases, now } = l;
  const t = now();
  const { after } = await change(l, id, actor, "api_key.revoked", (k) => ({ revokedAt: k.revokedAt ?? t }));
  forget(l, id);
  await leases?.drainKey(id);
  await waitForDrains(l, id);
  return toSummary(after);
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
export function toSummary(record: Omit<KeyRecord, "keyHash">): KeySummary {
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
    rateLimits: record.rateLimits ?? null,
    expiresAt: record.expiresAt ?? null,
    metadata: record.metadata ?? null,
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
