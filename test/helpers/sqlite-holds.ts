// What a gateway's SQLite file holds, read from outside the gateway (tests of ACS_WORKERS).
import Database from "better-sqlite3";

/**
 * The Holds of `keyId` in the SQLite file at `dbPath` (open or settled), counted by the worker
 * that placed each: `w1`, `w2`, … (the end of its instance id `<base>/w<k>`).
 */
export function holdsByWorker(dbPath: string, keyId: string): Record<string, number> {
  const db = new Database(dbPath, { readonly: true });
  try {
    const rows = db
      .prepare<[string], { instance_id: string; n: number }>(
        "SELECT instance_id, count(*) AS n FROM holds WHERE key_id = ? GROUP BY instance_id",
      )
      .all(keyId);
    return Object.fromEntries(rows.map((r) => [r.instance_id.replace(/^.*\//, ""), r.n]));
  } finally {
    db.close();
  }
}
