import Database from "better-sqlite3";
import type {
  BudgetStore,
  KeyRecord,
  KeyUsageRecord,
  PlaceHoldInput,
  PlaceHoldOutcome,
  SettleResult,
} from "./budget-store.js";
import { planHold } from "./plan-hold.js";

/** Options of {@link createSqliteBudgetStore}. */
export interface SqliteBudgetStoreOptions {
  /** Path of the SQLite file; created with its schema when missing. */
  readonly path: string;
  /**
   * How long a transaction waits for another process's write lock before failing with
   * SQLITE_BUSY, in milliseconds.
   * @default 5000
   */
  readonly busyTimeoutMs?: number;
  /**
   * SQLite `synchronous`. `full`: a committed Hold or settle survives power loss (one fsync per
   * commit). `normal`: survives a crash of the process (SIGKILL), not of the machine; faster.
   * @default "full"
   */
  readonly synchronous?: "full" | "normal";
}

const MIGRATIONS: readonly string[] = [
  // 0 → 1
  `
  CREATE TABLE keys (
    id            TEXT PRIMARY KEY,
    key_hash      BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    hint          TEXT NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    budget_tokens INTEGER NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0 AND spent_tokens <= budget_tokens),
    models        TEXT CHECK (models IS NULL OR json_valid(models)),
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER
  ) STRICT;
  CREATE TABLE holds (
    id             TEXT PRIMARY KEY,
    key_id         TEXT NOT NULL REFERENCES keys(id),
    tokens         INTEGER NOT NULL CHECK (tokens > 0),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    instance_id    TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'settled', 'reclaimed')),
    used_tokens    INTEGER CHECK (used_tokens IS NULL OR used_tokens >= 0),
    charged_tokens INTEGER NOT NULL DEFAULT 0 CHECK (charged_tokens >= 0 AND charged_tokens <= tokens),
    closed_at      INTEGER
  ) STRICT;
  CREATE INDEX holds_open_by_key ON holds (key_id) WHERE state = 'open';
  CREATE INDEX holds_open_by_expiry ON holds (expires_at) WHERE state = 'open';
  CREATE INDEX holds_open_by_instance ON holds (instance_id) WHERE state = 'open';
  `,
];

/** The schema version this code writes (`PRAGMA user_version`): one per migration. */
export const BUDGET_SCHEMA_VERSION: number = MIGRATIONS.length;

interface KeyRow {
  id: string;
  key_hash: Buffer;
  hint: string;
  name: string;
  budget_tokens: number;
  spent_tokens: number;
  models: string | null;
  created_at: number;
  revoked_at: number | null;
}

interface HoldRow {
  key_id: string;
  tokens: number;
  state: "open" | "settled" | "reclaimed";
}

/**
 * The embedded store: one SQLite file in WAL mode, shared safely by every thread and process that
 * opens it (each write is a `BEGIN IMMEDIATE` transaction, so a read-then-write never races).
 * Opens (or creates) the file and brings its schema to {@link BUDGET_SCHEMA_VERSION}; throws when
 * the file has a newer schema than this code knows.
 */
export function createSqliteBudgetStore(options: SqliteBudgetStoreOptions): BudgetStore {
  const db = new Database(options.path);
  try {
    db.pragma(`busy_timeout = ${Math.max(0, Math.floor(options.busyTimeoutMs ?? 5000))}`);
    db.pragma("journal_mode = WAL");
    db.pragma(`synchronous = ${options.synchronous === "normal" ? "NORMAL" : "FULL"}`);
    db.pragma("foreign_keys = ON");
    migrate(db);
  } catch (err) {
    db.close();
    throw err;
  }

  const stmt = {
    insertKey: db.prepare(
      `INSERT INTO keys (id, key_hash, hint, name, budget_tokens, spent_tokens, models, created_at, revoked_at)
       VALUES (@id, @key_hash, @hint, @name, @budget_tokens, @spent_tokens, @models, @created_at, @revoked_at)`,
    ),
    keyByHash: db.prepare<[Buffer], KeyRow>("SELECT * FROM keys WHERE key_hash = ?"),
    keyById: db.prepare<[string], KeyRow>("SELECT * FROM keys WHERE id = ?"),
    listKeys: db.prepare<[], KeyRow>("SELECT * FROM keys ORDER BY created_at, id"),
    heldByKey: db.prepare<[string], { held: number; open: number }>(
      "SELECT coalesce(sum(tokens), 0) AS held, count(*) AS open FROM holds WHERE key_id = ? AND state = 'open'",
    ),
    closedCounts: db.prepare<[string], { settled: number; reclaimed: number }>(
      `SELECT coalesce(sum(state = 'settled'), 0) AS settled, coalesce(sum(state = 'reclaimed'), 0) AS reclaimed
       FROM holds WHERE key_id = ? AND state != 'open'`,
    ),
    addBudget: db.prepare<[number, string]>("UPDATE keys SET budget_tokens = budget_tokens + ? WHERE id = ?"),
    revoke: db.prepare<[number, string]>("UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?"),
    insertHold: db.prepare<[string, string, number, number, number, string]>(
      `INSERT INTO holds (id, key_id, tokens, created_at, expires_at, instance_id) VALUES (?, ?, ?, ?, ?, ?)`,
    ),
    renew: db.prepare<[number, string]>("UPDATE holds SET expires_at = ? WHERE id = ? AND state = 'open'"),
    holdById: db.prepare<[string], HoldRow>("SELECT key_id, tokens, state FROM holds WHERE id = ?"),
    closeHold: db.prepare<[string, number, number, number, string]>(
      "UPDATE holds SET state = ?, used_tokens = ?, charged_tokens = ?, closed_at = ? WHERE id = ?",
    ),
    charge: db.prepare<[number, string]>("UPDATE keys SET spent_tokens = spent_tokens + ? WHERE id = ?"),
    reclaimExpired: db.prepare<[number, number]>(
      "UPDATE holds SET state = 'reclaimed', closed_at = ? WHERE state = 'open' AND expires_at <= ?",
    ),
    reclaimAll: db.prepare<[number]>(
      "UPDATE holds SET state = 'reclaimed', closed_at = ? WHERE state = 'open'",
    ),
    reclaimInstance: db.prepare<[number, string]>(
      "UPDATE holds SET state = 'reclaimed', closed_at = ? WHERE state = 'open' AND instance_id = ?",
    ),
  };

  const placeHold = db.transaction((input: PlaceHoldInput): PlaceHoldOutcome => {
    const key = stmt.keyById.get(input.keyId);
    if (key === undefined) return { kind: "unknown_key" };
    if (key.revoked_at !== null) return { kind: "revoked" };
    const { held } = stmt.heldByKey.get(input.keyId) ?? { held: 0 };
    const plan = planHold(key.budget_tokens - key.spent_tokens - held, input.demand);
    if (plan.kind === "insufficient") {
      return {
        kind: "insufficient",
        minimumTokens: plan.minimumTokens,
        budgetTokens: key.budget_tokens,
        spentTokens: key.spent_tokens,
        heldTokens: held,
      };
    }
    stmt.insertHold.run(input.holdId, input.keyId, plan.tokens, input.now, input.expiresAt, input.instanceId);
    return { kind: "held", tokens: plan.tokens, maxTokens: plan.maxTokens, clamped: plan.clamped };
  });

  const settleHold = db.transaction(
    (holdId: string, usedTokens: number, now: number): SettleResult | undefined => {
      const hold = stmt.holdById.get(holdId);
      if (hold === undefined) return undefined;
      if (hold.state === "settled")
        return { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
      const wanted = Math.min(usedTokens, hold.tokens);
      if (hold.state === "open") {
        stmt.closeHold.run("settled", usedTokens, wanted, now, holdId);
        stmt.charge.run(wanted, hold.key_id);
        return { outcome: "settled", chargedTokens: wanted, releasedTokens: hold.tokens - wanted };
      }
      // Reclaimed as stale, then settled late: its tokens went back to the Budget and may have been
      // held by other requests since, so charge only what is still free.
      const key = stmt.keyById.get(hold.key_id);
      const { held } = stmt.heldByKey.get(hold.key_id) ?? { held: 0 };
      const free = key === undefined ? 0 : Math.max(0, key.budget_tokens - key.spent_tokens - held);
      const charged = Math.min(wanted, free);
      stmt.closeHold.run("settled", usedTokens, charged, now, holdId);
      stmt.charge.run(charged, hold.key_id);
      return { outcome: "settled_after_reclaim", chargedTokens: charged, releasedTokens: 0 };
    },
  );

  const keyUsage = db.transaction((keyId: string): KeyUsageRecord | undefined => {
    const key = stmt.keyById.get(keyId);
    if (key === undefined) return undefined;
    const open = stmt.heldByKey.get(keyId) ?? { held: 0, open: 0 };
    const closed = stmt.closedCounts.get(keyId) ?? { settled: 0, reclaimed: 0 };
    return {
      ...toKeyRecord(key),
      heldTokens: open.held,
      openHolds: open.open,
      settledHolds: closed.settled,
      reclaimedHolds: closed.reclaimed,
    };
  });

  return {
    insertKey(record) {
      stmt.insertKey.run({
        id: record.id,
        key_hash: Buffer.from(record.keyHash),
        hint: record.hint,
        name: record.name,
        budget_tokens: record.budgetTokens,
        spent_tokens: record.spentTokens,
        models: record.models === null ? null : JSON.stringify(record.models),
        created_at: record.createdAt,
        revoked_at: record.revokedAt,
      });
    },
    findKeyByHash(keyHash) {
      const row = stmt.keyByHash.get(Buffer.from(keyHash));
      return row === undefined ? undefined : toKeyRecord(row);
    },
    listKeys() {
      return stmt.listKeys.all().map(toKeyRecord);
    },
    keyUsage(keyId) {
      return keyUsage(keyId);
    },
    addBudget(keyId, tokens) {
      return stmt.addBudget.run(tokens, keyId).changes === 1;
    },
    revokeKey(keyId, now) {
      return stmt.revoke.run(now, keyId).changes === 1;
    },
    placeHold(input) {
      return placeHold.immediate(input);
    },
    renewHold(holdId, expiresAt) {
      return stmt.renew.run(expiresAt, holdId).changes === 1;
    },
    settleHold(holdId, usedTokens, now) {
      return settleHold.immediate(holdId, usedTokens, now);
    },
    reclaimExpired(now) {
      return stmt.reclaimExpired.run(now, now).changes;
    },
    reclaimOpen(now, instanceId) {
      return (instanceId === undefined ? stmt.reclaimAll.run(now) : stmt.reclaimInstance.run(now, instanceId))
        .changes;
    },
    close() {
      db.close();
    },
  };
}

function migrate(db: Database.Database): void {
  db.transaction(() => {
    const version = db.pragma("user_version", { simple: true }) as number;
    if (version > BUDGET_SCHEMA_VERSION) {
      throw new Error(
        `Budget database schema version ${version} is newer than this code knows (${BUDGET_SCHEMA_VERSION})`,
      );
    }
    for (let v = version; v < BUDGET_SCHEMA_VERSION; v++) db.exec(MIGRATIONS[v] ?? "");
    if (version !== BUDGET_SCHEMA_VERSION) db.pragma(`user_version = ${BUDGET_SCHEMA_VERSION}`);
  }).immediate();
}

function toKeyRecord(row: KeyRow): KeyRecord {
  return {
    id: row.id,
    keyHash: row.key_hash,
    hint: row.hint,
    name: row.name,
    budgetTokens: row.budget_tokens,
    spentTokens: row.spent_tokens,
    models: row.models === null ? null : (JSON.parse(row.models) as string[]),
    createdAt: row.created_at,
    revokedAt: row.revoked_at,
  };
}
