// The PostgreSQL store's reads of the admin surface (see StoreBackend): a key, pages of keys and
// of audit rows (newest first: keys by (created_at, id), audit rows by `seq`), an admin key by hash.
import type pg from "pg";
import {
  ADMIN_KEY_COLUMNS,
  type AdminKeyColumns,
  AUDIT_COLUMNS,
  type AuditColumns,
  adminKeyOf,
  auditOf,
  pageOf,
} from "../admin-rows.js";
import type { StoreBackend } from "../backend.js";
import { type KeySqlRow, toKeyRow } from "./statements.js";

/** The admin reads on the pool. */
export function adminReads(
  pool: pg.Pool,
): Pick<StoreBackend, "getKey" | "listKeysPage" | "findAdminKeyByHash" | "listAuditPage"> {
  return {
    async getKey(keyId) {
      const r = (await pool.query<KeySqlRow>("SELECT * FROM keys WHERE id = $1", [keyId])).rows[0];
      return r === undefined ? undefined : toKeyRow(r);
    },
    async listKeysPage({ after, limit }) {
      if (after !== undefined) {
        const n = (await pool.query("SELECT 1 FROM keys WHERE id = $1", [after])).rowCount ?? 0;
        if (n === 0) return undefined; // keys are never deleted: the cursor stays
      }
      const { rows } = await pool.query<KeySqlRow>(
        `SELECT * FROM keys
         WHERE $1::text IS NULL OR (created_at, id) < (SELECT created_at, id FROM keys WHERE id = $1)
         ORDER BY created_at DESC, id DESC LIMIT $2`,
        [after ?? null, limit + 1],
      );
      return pageOf(rows.map(toKeyRow), limit);
    },
    async findAdminKeyByHash(keyHash) {
      const r = (
        await pool.query<AdminKeyColumns>(`SELECT ${ADMIN_KEY_COLUMNS} FROM admin_keys WHERE key_hash = $1`, [
          Buffer.from(keyHash),
        ])
      ).rows[0];
      return r === undefined ? undefined : adminKeyOf(r);
    },
    async listAuditPage({ after, limit }) {
      if (after !== undefined) {
        const n = (await pool.query("SELECT 1 FROM audit_logs WHERE id = $1", [after])).rowCount ?? 0;
        if (n === 0) return undefined;
      }
      const { rows } = await pool.query<AuditColumns<unknown>>(
        `SELECT ${AUDIT_COLUMNS} FROM audit_logs
         WHERE $1::text IS NULL OR seq < (SELECT seq FROM audit_logs WHERE id = $1)
         ORDER BY seq DESC LIMIT $2`,
        [after ?? null, limit + 1],
      );
      return pageOf(
        rows.map((r) => auditOf(r, (v) => v)),
        limit,
      );
    },
  };
}
