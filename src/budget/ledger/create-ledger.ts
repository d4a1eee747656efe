// Opening a ledger: its store (SQLite, PostgreSQL or given), the watch of the store's writes,
// its leases, its state and timers; and the BudgetLedger over that state.

import { hostname } from "node:os";
import { generateKeyId } from "../api-key.js";
import type { BudgetStore } from "../budget-store.js";
import type { Leases } from "../leases/api.js";
import { createLeases } from "../leases/create-leases.js";
import { DEFAULT_LEASE_SETTINGS } from "../leases/settings.js";
import type { HoldDemand } from "../plan-hold.js";
import { watchStoreWrites } from "../store-writes.js";
import { createPostgresBudgetStore, type PostgresBudgetStoreOptions } from "../stores/postgres/index.js";
import { createSqliteBudgetStore, type SqliteBudgetStoreOptions } from "../stores/sqlite/index.js";
import { createUsageLog } from "../usage/usage-log.js";
import { usageCompletions } from "../usage/usage-query.js";
import { authenticateAdmin, createAdminKey, listAuditLogs, revokeAdminKey } from "./admin-keys.js";
import type { BudgetLedger, KeyInfo } from "./api.js";
import { authenticate, checkModel } from "./auth.js";
import { checkInt } from "./errors.js";
import { placeHold } from "./holds.js";
import {
  createKey,
  getKey,
  grant,
  listKeys,
  listKeysPage,
  mustKnowKey,
  revoke,
  rotateKey,
  updateKey,
} from "./key-admin.js";
import {
  type BudgetLedgerOptions,
  DEFAULT_AUTH_CACHE_TTL_MS,
  DEFAULT_HOLD_TTL_MS,
  DEFAULT_RECLAIM_INTERVAL_MS,
} from "./options.js";
import { reclaimOnStart, reclaimStale, startReclaimTimer } from "./reclaim.js";
import { settle } from "./settle.js";
import { renew, standing } from "./standing.js";
import type { LedgerState } from "./state.js";
import { utcDay } from "./utc-day.js";

/**
 * Opens the ledger on a SQLite file (`path`, created and migrated on open), a PostgreSQL database
 * (`postgresUrl`, migrated on open) or a given store, and starts its timers (unref'd; they never
 * keep the process alive): reclaim, and with leases the lease steps and drain polling. Does not
 * reclaim on its own: the gateway calls reclaimOnStart() once at start-up.
 */
export async function createBudgetLedger(options: BudgetLedgerOptions): Promise<BudgetLedger> {
  const holdTtlMs = options.holdTtlMs ?? DEFAULT_HOLD_TTL_MS;
  checkInt("holdTtlMs", holdTtlMs, 1);
  const rawStore =
    "store" in options
      ? options.store
      : "postgresUrl" in options
        ? await createPostgresBudgetStore(postgresOptions(options))
        : createSqliteBudgetStore(sqliteOptions(options));
  const onError =
    options.onReclaimError ??
    ((err: unknown) => process.emitWarning(`Budget ledger: a background task failed: ${String(err)}`));
  const l = ledgerState(rawStore, holdTtlMs, onError, options);
  const timer = startReclaimTimer(l, options.reclaimIntervalMs ?? DEFAULT_RECLAIM_INTERVAL_MS, onError);
  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    if (timer !== undefined) clearInterval(timer);
    try {
      await l.usageLog.close();
      await l.leases?.close();
      await l.writes.close();
    } finally {
      await l.store.close();
    }
  };
  return ledgerApi(l, close);
}

/** The options of the PostgreSQL store out of the ledger's. */
function postgresOptions(options: {
  readonly postgresUrl: string;
  readonly poolSize?: number;
}): PostgresBudgetStoreOptions {
  return {
    url: options.postgresUrl,
    ...(options.poolSize === undefined ? {} : { poolSize: options.poolSize }),
  };
}

/** The options of the SQLite store out of the ledger's. */
function sqliteOptions(
  options: Extract<BudgetLedgerOptions, { readonly path: string }>,
): SqliteBudgetStoreOptions {
  return {
    path: options.path,
    ...(options.busyTimeoutMs === undefined ? {} : { busyTimeoutMs: options.busyTimeoutMs }),
    ...(options.synchronous === undefined ? {} : { synchronous: options.synchronous }),
    ...(options.walCheckpoint === undefined ? {} : { walCheckpoint: options.walCheckpoint }),
    ...(options.commit === undefined ? {} : { commit: options.commit }),
  };
}

/**
 * The state of a ledger opened on `rawStore`: its writes watched, its leases started (unless
 * off); `onError` is told each error of a background task.
 */
function ledgerState(
  rawStore: BudgetStore,
  holdTtlMs: number,
  onError: (err: unknown) => void,
  options: BudgetLedgerOptions,
): LedgerState {
  const now = options.now ?? Date.now;
  const writes = watchStoreWrites(rawStore, {
    now,
    dayOf: utcDay,
    onError,
    ...(options.onWritableChange === undefined ? {} : { onWritableChange: options.onWritableChange }),
    ...(options.maxPendingSettles === undefined ? {} : { maxPendingSettles: options.maxPendingSettles }),
  });
  const { store } = writes;
  const instanceId = options.instanceId ?? `${hostname()}:${process.pid}:${generateKeyId().slice(4)}`;
  const leaseOption = options.leases ?? store.kind === "postgres";
  const settings = {
    ...DEFAULT_LEASE_SETTINGS,
    ...(typeof leaseOption === "object" ? leaseOption : {}),
  };
  const leases: Leases | undefined =
    leaseOption === false
      ? undefined
      : createLeases({ store, instanceId, settings, now, dayOf: utcDay, holdTtlMs, onError, writes });
  const usageLog = createUsageLog(store, {
    now,
    onProblem: (message, err) =>
      onError(err === undefined ? new Error(message) : new Error(message, { cause: err })),
    ...options.usageLog,
  });
  return {
    store,
    writes,
    leases,
    usageLog,
    now,
    instanceId,
    holdTtlMs,
    settings,
    retentionMs: options.closedHoldRetentionMs ?? holdTtlMs,
    authCacheTtlMs: options.authCacheTtlMs ?? DEFAULT_AUTH_CACHE_TTL_MS,
    storeHolds: new Map(),
    authCache: new Map(),
  };
}

/** The BudgetLedger of an open ledger's state; `close` closes it (once). */
function ledgerApi(l: LedgerState, close: () => Promise<void>): BudgetLedger {
  const { store, writes, leases, instanceId } = l;
  return {
    instanceId,
    storeKind: store.kind,
    leased: leases !== undefined,
    get writable() {
      return writes.writable;
    },
    get pendingSettles() {
      return writes.pendingSettles;
    },
    authenticate: (authorization) => authenticate(l, authorization),
    checkModel,
    placeHold: ((key: KeyInfo, demand: HoldDemand) => placeHold(l, key, demand)) as BudgetLedger["placeHold"],
    standing: (holdId) => standing(l, holdId),
    renew: (holdId, usedTokens, ttlMs) => renew(l, holdId, usedTokens, ttlMs),
    settle: (holdId, usedTokens) => settle(l, holdId, usedTokens),
    reclaimStale: () => reclaimStale(l),
    reclaimOnStart: (scope) => reclaimOnStart(l, scope),
    async syncLeases() {
      await leases?.syncAll();
    },
    usageLog: l.usageLog,
    usageCompletions: (query) => usageCompletions(store, query, l.now()),
    close,
    createKey: (input, actor) => createKey(l, input, actor),
    getKey: (id) => getKey(l, id),
    listKeys: () => listKeys(l),
    listKeysPage: (page) => listKeysPage(l, page),
    updateKey: (id, changes, actor) => updateKey(l, id, changes, actor),
    grant: (id, tokens, actor) => grant(l, id, tokens, actor),
    rotateKey: (id, actor) => rotateKey(l, id, actor),
    revoke: (id, actor) => revoke(l, id, actor),
    usage: (id, days) => mustKnowKey(l, id, days),
    createAdminKey: (input, actor) => createAdminKey(l, input, actor),
    authenticateAdmin: (authorization) => authenticateAdmin(l, authorization),
    revokeAdminKey: (id, actor) => revokeAdminKey(l, id, actor),
    listAuditLogs: (page) => listAuditLogs(l, page),
  };
}
