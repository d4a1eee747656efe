// The admin transactions of a BudgetStore, written once for every backend: a key created, a key
// changed (settings, Budget, rotation, revoke) and an admin key created or revoked, each with its
// audit row in the same transaction. What the audit rows hold of a key is written here too.
import type { AdminKeyRecord, AuditStamp, KeyChangeInput, KeyChangeOutcome } from "../admin-store.js";
import type { KeyRecord } from "../budget-store.js";
import { KeySettingError, rateLimitsToJson } from "../key-settings.js";
import type { TxRows } from "./backend.js";

/** A key as its audit rows show it: its settings, never its hash; spent is not an admin setting. */
export function keyAuditView(k: KeyRecord): Record<string, unknown> {
  return {
    id: k.id,
    name: k.name,
    hint: k.hint,
    budget_tokens: k.budgetTokens,
    models: k.models === null ? null : [...k.models],
    rate_limits: k.rateLimits == null ? null : rateLimitsToJson(k.rateLimits),
    expires_at: k.expiresAt ?? null,
    metadata: k.metadata == null ? null : { ...k.metadata },
    created_at: k.createdAt,
    revoked_at: k.revokedAt,
  };
}

/** An admin key as its audit rows show it (never its hash). */
export function adminKeyAuditView(k: AdminKeyRecord): Record<string, unknown> {
  return { id: k.id, name: k.name, hint: k.hint, created_at: k.createdAt, revoked_at: k.revokedAt };
}

/** {@link AdminStore.createKeyAudited} inside its transaction. */
export async function createKeyIn(rows: TxRows, record: KeyRecord, audit: AuditStamp): Promise<void> {
  rows.insertKey(record);
  rows.insertAudit({ ...audit, targetId: record.id, before: null, after: keyAuditView(record) });
}

/** {@link AdminStore.changeKey} inside its transaction. */
export async function changeKeyIn(rows: TxRows, input: KeyChangeInput): Promise<KeyChangeOutcome> {
  const locked = await rows.lockKey(input.keyId);
  if (locked === undefined) return { kind: "unknown_key" };
  const patch = input.plan(locked);
  if (patch instanceof KeySettingError) return { kind: "refused", error: patch };
  const { heldTokens: _h, leasedTokens: _l, leaseBlockUntil: _b, ...before } = locked;
  const after: KeyRecord = { ...before, ...patch };
  if (after.spentTokens + locked.heldTokens + locked.leasedTokens > after.budgetTokens) {
    const committed = after.spentTokens + locked.heldTokens + locked.leasedTokens;
    return {
      kind: "refused",
      error: new KeySettingError(
        "budget_tokens",
        `The Budget cannot be lower than the ${committed} tokens already spent or held ` +
          `(${after.spentTokens} spent, ${locked.heldTokens + locked.leasedTokens} held or leased), got ${after.budgetTokens}.`,
      ),
    };
  }
  rows.writeKeySettings(after);
  if (before.revokedAt === null && after.revokedAt !== null) await rows.flagDrain(input.keyId);
  rows.insertAudit({
    ...input.audit,
    targetId: input.keyId,
    before: keyAuditView(before),
    after: keyAuditView(after),
  });
  return { kind: "changed", before, after };
}

/** {@link AdminStore.createAdminKey} inside its transaction. */
export async function createAdminKeyIn(
  rows: TxRows,
  record: AdminKeyRecord,
  audit: AuditStamp,
): Promise<void> {
  rows.insertAdminKey(record);
  rows.insertAudit({ ...audit, targetId: record.id, before: null, after: adminKeyAuditView(record) });
}

/** {@link AdminStore.revokeAdminKey} inside its transaction. */
export async function revokeAdminKeyIn(
  rows: TxRows,
  adminKeyId: string,
  audit: AuditStamp,
): Promise<AdminKeyRecord | undefined> {
  const before = await rows.lockAdminKey(adminKeyId);
  if (before === undefined) return undefined;
  const after: AdminKeyRecord = { ...before, revokedAt: before.revokedAt ?? audit.at };
  rows.revokeAdminKeyRow(adminKeyId, after.revokedAt ?? audit.at);
  rows.insertAudit({
    ...audit,
    targetId: adminKeyId,
    before: adminKeyAuditView(before),
    after: adminKeyAuditView(after),
  });
  return after;
}
