// Transactions of the PostgreSQL store on one connection of its pool, pipelined, and the row
// access inside them (TxRows of ../backend.ts): `lock*` reads with `FOR UPDATE`.
import type pg from "pg";
import { type AdminKeyColumns, adminKeyInsertValues, adminKeyOf, auditInsertValues } from "../admin-rows.js";
import type { AdminTxRows, TxRows } from "../backend.js";
import {
  type HoldColumns,
  holdRowOf,
  keyInsertValues,
  keySettingsValues,
  type LeaseColumns,
  leaseRowOf,
  leaseUpdateValues,
  type PeriodColumns,
  periodOf,
} from "../rows.js";
import { asBoolean, type KeySqlRow, run, type SQL, toKeyRow } from "./statements.js";

/** Row access on one connection; writes are sent at once (pipelined) and collected in `sent`. */
export function rowsOf(c: pg.PoolClient, sent: Promise<unknown>[]): TxRows {
  const write = (name: keyof typeof SQL, values: unknown[]): void => {
    const p = run(c, name, values);
    p.catch(() => undefined); // seen by the transaction's Promise.all(sent), not unhandled meanwhile
    sent.push(p);
  };
  return {
    ...adminRowsOf(c, write),
    async lockKey(id) {
      const r = (await run<KeySqlRow>(c, "lockKey", [id])).rows[0];
      return r === undefined ? undefined : toKeyRow(r);
    },
    async lockHold(id) {
      const r = (await run<HoldColumns>(c, "lockHold", [id])).rows[0];
      return r === undefined ? undefined : holdRowOf(r);
    },
    async lockLease(id) {
      const r = (await run<LeaseColumns<boolean>>(c, "lockLease", [id])).rows[0];
      return r === undefined ? undefined : leaseRowOf(r, asBoolean);
    },
    async lockPeriod(keyId, periodStart) {
      const r = (await run<PeriodColumns>(c, "lockPeriod", [keyId, periodStart])).rows[0];
      return r === undefined ? undefined : { keyId, ...periodOf(r) };
    },
    writePeriod(p) {
      const { keyId, periodStart, periodEnd, budgetTokens, spentTokens, heldTokens, leasedTokens } = p;
      write("writePeriod", [
        keyId,
        periodStart,
        periodEnd,
        budgetTokens,
        spentTokens,
        heldTokens,
        leasedTokens,
      ]);
    },
    rollKey(id, periodStart, periodEnd) {
      write("rollKey", [id, periodStart, periodEnd]);
    },
    insertHold(h) {
      write("insertHold", [h.id, h.keyId, h.tokens, h.createdAt, h.expiresAt, h.instanceId, h.periodStart]);
    },
    closeHold(id, state, used, charged, closedAt) {
      write("closeHold", [id, state, used, charged, closedAt]);
    },
    insertLease(l, u) {
      const row = [l.id, l.keyId, l.instanceId, l.createdAt, l.periodStart];
      write("insertLease", [...row, ...leaseUpdateValues(u, asBoolean)]);
    },
    updateLease(id, u) {
      write("updateLease", [id, ...leaseUpdateValues(u, asBoolean)]);
    },
    setKeyNumbers(id, spent, held, leased) {
      write("setKeyNumbers", [id, spent, held, leased]);
    },
    addDaily(keyId, day, charged, settled, reclaimed) {
      write("addDaily", [keyId, day, charged, settled, reclaimed]);
    },
    async flagDrain(keyId, others) {
      const r =
        others === undefined
          ? await run(c, "drainAll", [keyId])
          : await run(c, "drainOthers", [keyId, others.instanceId, others.now, others.periodStart]);
      return r.rowCount ?? 0;
    },
    blockLeases(keyId, until) {
      write("blockLeases", [keyId, until]);
    },
    async revoke(keyId, now) {
      return ((await run(c, "revoke", [keyId, now])).rowCount ?? 0) === 1;
    },
  };
}

/** The writes of the admin surface (keys, admin keys, the audit log) in a transaction: {@link rowsOf}'s. */
function adminRowsOf(
  c: pg.PoolClient,
  write: (name: keyof typeof SQL, values: unknown[]) => void,
): AdminTxRows {
  return {
    insertKey(record) {
      write("insertKey", keyInsertValues(record));
    },
    writeKeySettings(record) {
      write("writeKeySettings", keySettingsValues(record));
    },
    insertAudit(entry) {
      write("insertAudit", auditInsertValues(entry));
    },
    insertAdminKey(record) {
      write("insertAdminKey", adminKeyInsertValues(record));
    },
    async lockAdminKey(id) {
      const r = (await run<AdminKeyColumns>(c, "lockAdminKey", [id])).rows[0];
      return r === undefined ? undefined : adminKeyOf(r);
    },
    revokeAdminKeyRow(id, revokedAt) {
      write("revokeAdminKey", [id, revokedAt]);
    },
  };
}

/**
 * Runs fn between `begin` and COMMIT on one connection of the pool. The connection pipelines: BEGIN
 * goes out with fn's first read, and fn's writes (collected in `sent`) with the COMMIT, so a
 * transaction that reads the key row and writes costs two round trips. Rolls back and rethrows
 * when fn (or a write) fails; a connection that broke meanwhile is dropped from the pool.
 */
export async function inTransaction<T>(
  pool: pg.Pool,
  begin: string,
  fn: (c: pg.PoolClient, sent: Promise<unknown>[]) => Promise<T>,
): Promise<T> {
  let broken: Error | undefined;
  const client = await pool.connect();
  // A checked-out connection's errors are its queries' (they reject); this listener keeps one
  // that ends while the transaction runs (the server gone) from being an uncaught 'error'.
  const onError = (err: Error): void => {
    broken ??= err;
  };
  client.on("error", onError);
  const begun = client.query(begin);
  begun.catch(() => undefined);
  const sent: Promise<unknown>[] = [begun];
  try {
    const result = await fn(client, sent);
    const commit = client.query("COMMIT");
    commit.catch(() => undefined);
    sent.push(commit);
    await Promise.all(sent);
    return result;
  } catch (err) {
    await Promise.allSettled(sent);
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      broken = rollbackError as Error; // the connection is unusable: the pool drops it
    }
    throw err;
  } finally {
    client.release(broken);
    client.off("error", onError);
  }
}
