// The SQLite store's schema: its migrations, one per version (`PRAGMA user_version`), applied in
// one `BEGIN IMMEDIATE` transaction when a store opens the file.
import type Database from "better-sqlite3";
import { schemaTooNewError } from "../rows.js";

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
  // 1 → 2: held and leased tokens on the key row (spent + held + leased ≤ budget is a CHECK),
  // leases, usage per key and day (closed Holds are purged after a retention time).
  `
  CREATE TABLE keys_v2 (
    id                TEXT PRIMARY KEY,
    key_hash          BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    hint              TEXT NOT NULL,
    name              TEXT NOT NULL DEFAULT '',
    budget_tokens     INTEGER NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens      INTEGER NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0),
    held_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    leased_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    lease_block_until INTEGER NOT NULL DEFAULT 0,
    models            TEXT CHECK (models IS NULL OR json_valid(models)),
    created_at        INTEGER NOT NULL,
    revoked_at        INTEGER,
    CHECK (spent_tokens + held_tokens + leased_tokens <= budget_tokens)
  ) STRICT;
  INSERT INTO keys_v2 (id, key_hash, hint, name, budget_tokens, spent_tokens, held_tokens, models, created_at, revoked_at)
    SELECT k.id, k.key_hash, k.hint, k.name, k.budget_tokens, k.spent_tokens,
           coalesce((SELECT sum(h.tokens) FROM holds h WHERE h.key_id = k.id AND h.state = 'open'), 0),
           k.models, k.created_at, k.revoked_at
    FROM keys k;
  DROP TABLE keys;
  ALTER TABLE keys_v2 RENAME TO keys;
  CREATE TABLE leases (
    id             TEXT PRIMARY KEY,
    key_id         TEXT NOT NULL REFERENCES keys(id),
    instance_id    TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'reclaimed')),
    tokens         INTEGER NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    reclaim_charge INTEGER NOT NULL DEFAULT 0 CHECK (reclaim_charge >= 0 AND reclaim_charge <= tokens),
    holds          INTEGER NOT NULL DEFAULT 0 CHECK (holds >= 0),
    seq            INTEGER NOT NULL DEFAULT 0,
    last_result    INTEGER NOT NULL DEFAULT 0,
    drain          INTEGER NOT NULL DEFAULT 0 CHECK (drain IN (0, 1)),
    closing        INTEGER NOT NULL DEFAULT 0 CHECK (closing IN (0, 1)),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    closed_at      INTEGER
  ) STRICT;
  CREATE INDEX leases_open_by_key ON leases (key_id) WHERE state = 'open';
  CREATE INDEX leases_open_by_expiry ON leases (expires_at) WHERE state = 'open';
  CREATE INDEX leases_open_by_instance ON leases (instance_id) WHERE state = 'open';
  CREATE INDEX leases_closed ON leases (closed_at) WHERE state != 'open';
  CREATE INDEX holds_closed ON holds (closed_at) WHERE state != 'open';
  CREATE TABLE usage_daily (
    key_id          TEXT NOT NULL REFERENCES keys(id),
    day             TEXT NOT NULL,
    charged_tokens  INTEGER NOT NULL DEFAULT 0,
    settled_holds   INTEGER NOT NULL DEFAULT 0,
    reclaimed_holds INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, day)
  ) STRICT, WITHOUT ROWID;
  INSERT INTO usage_daily (key_id, day, charged_tokens, settled_holds, reclaimed_holds)
    SELECT key_id, strftime('%Y-%m-%d', coalesce(closed_at, created_at) / 1000, 'unixepoch'),
           sum(charged_tokens), sum(state = 'settled'), sum(state = 'reclaimed')
    FROM holds WHERE state != 'open' GROUP BY 1, 2;
  `,
  // 2 → 3: Budget periods (src/budget/README.md "Budget periods"): the key's period and the start
  // and end of its current one, the period each Hold and lease was placed in, the past periods.
  `
  ALTER TABLE keys ADD COLUMN period TEXT NOT NULL DEFAULT 'none' CHECK (period IN ('none', 'day', 'week', 'month'));
  ALTER TABLE keys ADD COLUMN period_start INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE keys ADD COLUMN period_end INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE holds ADD COLUMN period_start INTEGER NOT NULL DEFAULT 0;
  ALTER TABLE leases ADD COLUMN period_start INTEGER NOT NULL DEFAULT 0;
  CREATE TABLE budget_periods (
    key_id        TEXT NOT NULL REFERENCES keys(id),
    period_start  INTEGER NOT NULL,
    period_end    INTEGER NOT NULL,
    budget_tokens INTEGER NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0),
    held_tokens   INTEGER NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    leased_tokens INTEGER NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    CHECK (spent_tokens + held_tokens + leased_tokens <= budget_tokens),
    PRIMARY KEY (key_id, period_start)
  ) STRICT, WITHOUT ROWID;
  `,
  // 3 → 4: one row per settled request (src/budget/README.md, "Usage records"); no foreign key
  // on key_id, so that a flush never fails on a key and the table outlives what happens to keys.
  `
  CREATE TABLE usage_records (
    id                INTEGER PRIMARY KEY,
    key_id            TEXT NOT NULL,
    model             TEXT NOT NULL,
    input_tokens      INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens     INTEGER NOT NULL CHECK (output_tokens >= 0),
    activation_tokens INTEGER NOT NULL CHECK (activation_tokens >= 0),
    charged_tokens    INTEGER NOT NULL CHECK (charged_tokens >= 0),
    status            INTEGER NOT NULL,
    request_id        TEXT NOT NULL,
    created_at        INTEGER NOT NULL
  ) STRICT;
  CREATE INDEX usage_records_by_time ON usage_records (created_at);
  CREATE INDEX usage_records_by_key ON usage_records (key_id, created_at);
  CREATE INDEX usage_records_by_model ON usage_records (model, created_at);
  `,
  // 4 → 5: the admin surface — a key's rate limits, expiry and metadata; admin keys; the audit log
  // (append-only: triggers refuse every UPDATE and DELETE of its rows).
  `
  ALTER TABLE keys ADD COLUMN rate_limits TEXT CHECK (rate_limits IS NULL OR json_valid(rate_limits));
  ALTER TABLE keys ADD COLUMN expires_at INTEGER;
  ALTER TABLE keys ADD COLUMN metadata TEXT CHECK (metadata IS NULL OR json_valid(metadata));
  CREATE INDEX keys_by_created ON keys (created_at, id);
  CREATE TABLE admin_keys (
    id         TEXT PRIMARY KEY,
    key_hash   BLOB NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    hint       TEXT NOT NULL,
    name       TEXT NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
  ) STRICT;
  CREATE TABLE audit_logs (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    id        TEXT NOT NULL UNIQUE,
    at        INTEGER NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    target_id TEXT NOT NULL,
    before    TEXT CHECK (before IS NULL OR json_valid(before)),
    after     TEXT CHECK (after IS NULL OR json_valid(after))
  ) STRICT;
  CREATE TRIGGER audit_logs_no_update BEFORE UPDATE ON audit_logs
    BEGIN SELECT RAISE(ABORT, 'audit_logs is append-only'); END;
  CREATE TRIGGER audit_logs_no_delete BEFORE DELETE ON audit_logs
    BEGIN SELECT RAISE(ABORT, 'audit_logs is append-only'); END;
  `,
];

/** The schema version this code writes (`PRAGMA user_version`): one per migration. */
export const BUDGET_SCHEMA_VERSION: number = MIGRATIONS.length;

/**
 * Brings the schema of `db` to {@link BUDGET_SCHEMA_VERSION} (foreign keys off meanwhile: the
 * caller turns them on); throws when the file has a newer schema, or a migration broke a foreign key.
 */
export function migrate(db: Database.Database): void {
  // Rebuilding a table (1 → 2) needs foreign keys off, which cannot change inside a transaction.
  db.pragma("foreign_keys = OFF");
  db.transaction(() => {
    const version = db.pragma("user_version", { simple: true }) as number;
    if (version > BUDGET_SCHEMA_VERSION) {
      throw schemaTooNewError(version, BUDGET_SCHEMA_VERSION);
    }
    for (let v = version; v < BUDGET_SCHEMA_VERSION; v++) db.exec(MIGRATIONS[v] ?? "");
    if (version !== BUDGET_SCHEMA_VERSION) {
      const broken = db.pragma("foreign_key_check") as unknown[];
      if (broken.length > 0) throw new Error(`Budget database migration broke ${broken.length} foreign keys`);
      db.pragma(`user_version = ${BUDGET_SCHEMA_VERSION}`);
    }
  }).immediate();
}
