// Row access inside a transaction of the SQLite store (TxRows of ../backend.ts), on its prepared
// statements, with the one-statement shortcuts that its BEGIN IMMEDIATE allows.

import { adminKeyInsertValues, adminKeyOf, auditInsertValues } from "../admin-rows.js";
import type { AdminTxRows, TxRows } from "../backend.js";
import {
  holdRowOf,
  keyInsertValues,
  keySettingsValues,
  leaseRowOf,
  leaseUpdateValues,
  periodOf,
} from "../rows.js";
import { fromBit, type Statements, toBit, toKeyRow } from "./statements.js";

/**
 * Row access inside a transaction. Every "lock" is a plain read: the transaction's BEGIN IMMEDIATE
 * holds the database's write lock already (hence also the shortcuts).
 */
export function rowsOf(stmt: Statements): TxRows {
  const rows: TxRows = {
    ...adminRowsOf(stmt),
    async lockKey(id) {
      const row = stmt.keyById.get(id);
      return row === undefined ? undefined : toKeyRow(row);
    },
    async lockHold(id) {
      const r = stmt.holdById.get(id);
      return r === undefined ? undefined : holdRowOf(r);
    },
    async lockLease(id) {
      const r = stmt.leaseById.get(id);
      return r === undefined ? undefined : leaseRowOf(r, fromBit);
    },
    async lockPeriod(keyId, periodStart) {
      const r = stmt.periodRow.get(keyId, periodStart);
      return r === undefined ? undefined : { keyId, ...periodOf(r) };
    },
    writePeriod(p) {
      stmt.writePeriod.run(
        p.keyId,
        p.periodStart,
        p.periodEnd,
        p.budgetTokens,
        p.spentTokens,
        p.heldTokens,
        p.leasedTokens,
      );
    },
    rollKey(id, periodStart, periodEnd) {
      stmt.rollKey.run(periodStart, periodEnd, id);
    },
    insertHold(h) {
      stmt.insertHold.run(h.id, h.keyId, h.tokens, h.createdAt, h.expiresAt, h.instanceId, h.periodStart);
    },
    closeHold(id, state, used, charged, closedAt) {
      stmt.closeHold.run(state, used, charged, closedAt, id);
    },
    insertLease(l, columns) {
      stmt.insertLease.run(l.id, l.keyId, l.instanceId, l.createdAt, columns.expiresAt, l.periodStart);
      rows.updateLease(l.id, columns);
    },
    updateLease(id, u) {
      stmt.updateLease.run(...leaseUpdateValues(u, toBit), id);
    },
    setKeyNumbers(id, spent, held, leased) {
      stmt.setKeyNumbers.run(spent, held, leased, id);
    },
    addDaily(keyId, day, charged, settled, reclaimed) {
      stmt.addDaily.run(keyId, day, charged, settled, reclaimed);
    },
    async flagDrain(keyId, others) {
      return others === undefined
        ? stmt.drainAll.run(keyId).changes
        : stmt.drainOthers.run(keyId, others.instanceId, others.now, others.periodStart).changes;
    },
    blockLeases(keyId, until) {
      stmt.blockLeases.run(until, keyId);
    },
    async revoke(keyId, now) {
      return stmt.revoke.run(now, keyId).changes === 1;
    },
    // BEGIN IMMEDIATE holds the database's write lock from the start: no row needs locking first.
    shortcuts: {
      reserve: (keyId, tokens, now) => stmt.reserve.get(tokens, keyId, now, now, tokens)?.period_start,
      settleOpen(holdId, usedTokens, closedAt) {
        const r = stmt.settleOpen.get(usedTokens, usedTokens, closedAt, holdId, closedAt);
        return r === undefined ? undefined : { keyId: r.key_id, tokens: r.tokens, charged: r.charged_tokens };
      },
      moveHeld(keyId, charged, released) {
        stmt.moveHeld.run(charged, released, keyId);
      },
    },
  };
  return rows;
}

/** The writes of the admin surface (keys, admin keys, the audit log): {@link rowsOf}'s. */
function adminRowsOf(stmt: Statements): AdminTxRows {
  return {
    insertKey(record) {
      stmt.insertKey.run(...keyInsertValues(record));
    },
    writeKeySettings(record) {
      stmt.writeKeySettings.run(...keySettingsValues(record));
    },
    insertAudit(entry) {
      stmt.insertAudit.run(...auditInsertValues(entry));
    },
    insertAdminKey(record) {
      stmt.insertAdminKey.run(...adminKeyInsertValues(record));
    },
    async lockAdminKey(id) {
      const r = stmt.adminKeyById.get(id);
      return r === undefined ? undefined : adminKeyOf(r);
    },
    revokeAdminKeyRow(id, revokedAt) {
      stmt.revokeAdminKey.run(revokedAt, id);
    },
  };
}
