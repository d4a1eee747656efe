// The SQLite store's statements of the admin surface (key pages, admin keys, the audit log),
// prepared once on the migrated database. Pages are newest first: keys by (created_at, id), audit
// rows by `seq` (the order they were written); `after` is the last id of the previous page.
import type Database from "better-sqlite3";
import { ADMIN_KEY_COLUMNS, type AdminKeyColumns, AUDIT_COLUMNS, type AuditColumns } from "../admin-rows.js";
import type { KeyColumns } from "../rows.js";

/** The statements of the admin surface. */
export function prepareAdminStatements(db: Database.Database) {
  return {
    keysFirst: db.prepare<[number], KeyColumns<string | null>>(
      "SELECT * FROM keys ORDER BY created_at DESC, id DESC LIMIT ?",
    ),
    keysAfter: db.prepare<[string, number], KeyColumns<string | null>>(
      `SELECT k.* FROM keys k, (SELECT created_at AS c, id AS i FROM keys WHERE id = ?) cursor
       WHERE (k.created_at, k.id) < (cursor.c, cursor.i) ORDER BY k.created_at DESC, k.id DESC LIMIT ?`,
    ),
    insertAdminKey: db.prepare<[string, Buffer, string, string, number, number | null]>(
      `INSERT INTO admin_keys (${ADMIN_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)`,
    ),
    adminKeyById: db.prepare<[string], AdminKeyColumns>(
      `SELECT ${ADMIN_KEY_COLUMNS} FROM admin_keys WHERE id = ?`,
    ),
    adminKeyByHash: db.prepare<[Buffer], AdminKeyColumns>(
      `SELECT ${ADMIN_KEY_COLUMNS} FROM admin_keys WHERE key_hash = ?`,
    ),
    revokeAdminKey: db.prepare<[number, string]>(
      "UPDATE admin_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?",
    ),
    insertAudit: db.prepare<[string, number, string, string, string, string | null, string | null]>(
      `INSERT INTO audit_logs (${AUDIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)`,
    ),
    auditFirst: db.prepare<[number], AuditColumns<string>>(
      `SELECT ${AUDIT_COLUMNS} FROM audit_logs ORDER BY seq DESC LIMIT ?`,
    ),
    auditAfter: db.prepare<[string, number], AuditColumns<string>>(
      `SELECT ${AUDIT_COLUMNS} FROM audit_logs WHERE seq < (SELECT seq FROM audit_logs WHERE id = ?)
       ORDER BY seq DESC LIMIT ?`,
    ),
    auditExists: db.prepare<[string], { n: number }>("SELECT count(*) AS n FROM audit_logs WHERE id = ?"),
  };
}
