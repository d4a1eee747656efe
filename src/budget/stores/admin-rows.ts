// The admin tables' rows as both backends' SQL reads and writes them: `admin_keys` and
// `audit_logs` (snake_case columns, times Unix epoch ms). What differs between the two backends is
// how a JSON column reads (`J`: PostgreSQL jsonb parsed, SQLite JSON text).
import type { AdminKeyRecord, AuditEntry } from "../admin-store.js";

/** An `admin_keys` row. */
export interface AdminKeyColumns {
  id: string;
  key_hash: Buffer;
  hint: string;
  name: string;
  created_at: number;
  revoked_at: number | null;
}

/** An `audit_logs` row (but its `seq`, the order rows were written in). */
export interface AuditColumns<J> {
  id: string;
  at: number;
  actor: string;
  action: string;
  target_id: string;
  before: J | null;
  after: J | null;
}

/** The columns of `INSERT INTO admin_keys`, in the order of {@link adminKeyInsertValues}. */
export const ADMIN_KEY_COLUMNS = "id, key_hash, hint, name, created_at, revoked_at";

/** The columns of `INSERT INTO audit_logs`, in the order of {@link auditInsertValues}. */
export const AUDIT_COLUMNS = "id, at, actor, action, target_id, before, after";

export function adminKeyInsertValues(
  r: AdminKeyRecord,
): [string, Buffer, string, string, number, number | null] {
  return [r.id, Buffer.from(r.keyHash), r.hint, r.name, r.createdAt, r.revokedAt];
}

/** The values of an audit row; before and after as JSON text (PostgreSQL casts it to jsonb). */
export function auditInsertValues(
  e: AuditEntry,
): [string, number, string, string, string, string | null, string | null] {
  const json = (v: AuditEntry["before"]) => (v === null ? null : JSON.stringify(v));
  return [e.id, e.at, e.actor, e.action, e.targetId, json(e.before), json(e.after)];
}

export function adminKeyOf(r: AdminKeyColumns): AdminKeyRecord {
  return {
    id: r.id,
    keyHash: r.key_hash,
    hint: r.hint,
    name: r.name,
    createdAt: r.created_at,
    revokedAt: r.revoked_at,
  };
}

/** The AuditEntry of a row; `json` decodes a JSON column from the backend's form. */
export function auditOf<J>(r: AuditColumns<J>, json: (v: J) => unknown): AuditEntry {
  const obj = (v: J | null) => (v === null ? null : (json(v) as Record<string, unknown>));
  return {
    id: r.id,
    at: r.at,
    actor: r.actor,
    action: r.action,
    targetId: r.target_id,
    before: obj(r.before),
    after: obj(r.after),
  };
}

/** A page of `limit` items out of the `limit + 1` rows read: hasMore when the extra one came. */
export function pageOf<T>(rows: readonly T[], limit: number): { items: T[]; hasMore: boolean } {
  return { items: rows.slice(0, limit), hasMore: rows.length > limit };
}
