// The BudgetStore of a backend: the shared transactions (./hold-steps.ts, ./lease-steps.ts,
// ./reclaim.ts) over the backend's rows, its plain statements as they are.
import type { BudgetStore, KeyUsageRecord } from "../budget-store.js";
import { changeKeyIn, createAdminKeyIn, createKeyIn, revokeAdminKeyIn } from "./admin-steps.js";
import type { StoreBackend, TxRows } from "./backend.js";
import { chargeLateIn, placeHoldIn, settleHold } from "./hold-steps.js";
import { syncLeaseIn } from "./lease-steps.js";
import { reclaimItems } from "./reclaim.js";
import { insertUsageOn, usageAggregateOn } from "./usage-sql.js";

/** The KeyUsageRecord of what {@link StoreBackend.keyUsage} read; undefined for an unknown key. */
function usageRecordOf(u: Awaited<ReturnType<StoreBackend["keyUsage"]>>): KeyUsageRecord | undefined {
  if (u === undefined) return undefined;
  const { key } = u;
  return {
    id: key.id,
    keyHash: key.keyHash,
    hint: key.hint,
    name: key.name,
    budgetTokens: key.budgetTokens,
    spentTokens: key.spentTokens,
    models: key.models,
    createdAt: key.createdAt,
    revokedAt: key.revokedAt,
    rateLimits: key.rateLimits ?? null,
    expiresAt: key.expiresAt ?? null,
    metadata: key.metadata ?? null,
    heldTokens: key.heldTokens,
    openHolds: u.openHolds,
    leasedTokens: key.leasedTokens,
    leases: u.leases,
    settledHolds: u.settledHolds,
    reclaimedHolds: u.reclaimedHolds,
    daily: u.daily,
    period: key.period,
    periodStart: key.periodStart,
    periods: u.periods,
  };
}

/** {@link BudgetStore.revokeKey} inside its transaction: revokes the key and has all its leases drain. */
async function revokeIn(rows: TxRows, keyId: string, now: number): Promise<boolean> {
  if (!(await rows.revoke(keyId, now))) return false;
  await rows.flagDrain(keyId);
  return true;
}

/** The BudgetStore of a backend: every rule of Holds, leases and reclaim, one transaction each. */
export function createBudgetStoreOn(backend: StoreBackend): BudgetStore {
  const tx = backend.transaction.bind(backend);
  return {
    kind: backend.kind,
    insertKey: (record) => backend.insertKey(record),
    findKeyByHash: (hash) => backend.findKeyByHash(hash),
    listKeys: () => backend.listKeys(),
    getKey: (keyId) => backend.getKey(keyId),
    listKeysPage: (page) => backend.listKeysPage(page),
    createKeyAudited: (record, audit) => tx((rows) => createKeyIn(rows, record, audit)),
    changeKey: (input) => tx((rows) => changeKeyIn(rows, input)),
    createAdminKey: (record, audit) => tx((rows) => createAdminKeyIn(rows, record, audit)),
    findAdminKeyByHash: (hash) => backend.findAdminKeyByHash(hash),
    revokeAdminKey: (id, audit) => tx((rows) => revokeAdminKeyIn(rows, id, audit)),
    listAuditPage: (page) => backend.listAuditPage(page),
    keyUsage: async (keyId, days = 31) => usageRecordOf(await backend.keyUsage(keyId, days)),
    addBudget: (keyId, tokens) => backend.addBudget(keyId, tokens),
    revokeKey: (keyId, now) => tx((rows) => revokeIn(rows, keyId, now)),
    placeHold: (input) => tx((rows) => placeHoldIn(rows, input)),
    renewHold: (holdId, expiresAt, usedTokens) => backend.renewHold(holdId, expiresAt, usedTokens),
    settleHold: (holdId, usedTokens, now, day) => settleHold(backend, holdId, usedTokens, now, day),
    chargeLate: (input) => tx((rows) => chargeLateIn(rows, input)),
    syncLease: (input) => tx((rows) => syncLeaseIn(rows, input)),
    drainRequests: (instanceId) => backend.drainRequests(instanceId),
    drainsPending: (keyId, now, exceptInstanceId) =>
      backend.drainsPending(keyId, now, exceptInstanceId ?? ""),

    async reclaimExpired(now, day) {
      return reclaimItems(tx, await backend.openItems({ expiredAt: now }), now, day, (e) => e <= now);
    },

    async reclaimOpen(now, day, instanceId) {
      return reclaimItems(tx, await backend.openItems({ instanceId }), now, day, () => true);
    },

    purgeClosed: (before) => backend.purgeClosed(before),
    probeWrite: () => backend.probeWrite(),
    insertUsage: (records) => insertUsageOn(backend, records),
    usageAggregate: (query) => usageAggregateOn(backend, query),
    close: () => backend.close(),
  };
}
