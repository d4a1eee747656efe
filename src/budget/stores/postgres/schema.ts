// The PostgreSQL store's schema: its migrations, one per version (table `budget_schema_migrations`),
// applied in one transaction under an advisory lock, so that replicas starting together migrate once.
import type pg from "pg";
import { schemaTooNewError } from "../rows.js";

const MIGRATIONS: readonly string[] = [
  // 0 → 1
  `
  CREATE TABLE keys (
    id                text PRIMARY KEY,
    key_hash          bytea NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
    hint              text NOT NULL,
    name              text NOT NULL DEFAULT '',
    budget_tokens     bigint NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens      bigint NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0),
    held_tokens       bigint NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    leased_tokens     bigint NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    lease_block_until bigint NOT NULL DEFAULT 0,
    models            jsonb CHECK (models IS NULL OR jsonb_typeof(models) = 'array'),
    created_at        bigint NOT NULL,
    revoked_at        bigint,
    CHECK (spent_tokens + held_tokens + leased_tokens <= budget_tokens)
  );
  CREATE TABLE holds (
    id             text PRIMARY KEY,
    key_id         text NOT NULL REFERENCES keys(id),
    tokens         bigint NOT NULL CHECK (tokens > 0),
    created_at     bigint NOT NULL,
    expires_at     bigint NOT NULL,
    instance_id    text NOT NULL,
    state          text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'settled', 'reclaimed')),
    used_tokens    bigint CHECK (used_tokens IS NULL OR used_tokens >= 0),
    charged_tokens bigint NOT NULL DEFAULT 0 CHECK (charged_tokens >= 0 AND charged_tokens <= tokens),
    closed_at      bigint
  );
  CREATE INDEX holds_open_by_key ON holds (key_id) WHERE state = 'open';
  CREATE INDEX holds_open_by_expiry ON holds (expires_at) WHERE state = 'open';
  CREATE INDEX holds_open_by_instance ON holds (instance_id) WHERE state = 'open';
  CREATE INDEX holds_closed ON holds (closed_at) WHERE state <> 'open';
  CREATE TABLE leases (
    id             text PRIMARY KEY,
    key_id         text NOT NULL REFERENCES keys(id),
    instance_id    text NOT NULL,
    state          text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'reclaimed')),
    tokens         bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    reclaim_charge bigint NOT NULL DEFAULT 0 CHECK (reclaim_charge >= 0 AND reclaim_charge <= tokens),
    holds          bigint NOT NULL DEFAULT 0 CHECK (holds >= 0),
    seq            bigint NOT NULL DEFAULT 0,
    last_result    bigint NOT NULL DEFAULT 0,
    drain          boolean NOT NULL DEFAULT false,
    closing        boolean NOT NULL DEFAULT false,
    created_at     bigint NOT NULL,
    expires_at     bigint NOT NULL,
    closed_at      bigint
  );
  CREATE INDEX leases_open_by_key ON leases (key_id) WHERE state = 'open';
  CREATE INDEX leases_open_by_expiry ON leases (expires_at) WHERE state = 'open';
  CREATE INDEX leases_open_by_instance ON leases (instance_id) WHERE state = 'open';
  CREATE INDEX leases_closed ON leases (closed_at) WHERE state <> 'open';
  CREATE TABLE usage_daily (
    key_id          text NOT NULL REFERENCES keys(id),
    day             date NOT NULL,
    charged_tokens  bigint NOT NULL DEFAULT 0,
    settled_holds   bigint NOT NULL DEFAULT 0,
    reclaimed_holds bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, day)
  );
  `,
  // 1 → 2: Budget periods (src/budget/README.md "Budget periods"): the key's period and the start
  // and end of its current one, the period each Hold and lease was placed in, the past periods.
  `
  ALTER TABLE keys
    ADD COLUMN period text NOT NULL DEFAULT 'none' CHECK (period IN ('none', 'day', 'week', 'month')),
    ADD COLUMN period_start bigint NOT NULL DEFAULT 0,
    ADD COLUMN period_end bigint NOT NULL DEFAULT 0;
  ALTER TABLE holds ADD COLUMN period_start bigint NOT NULL DEFAULT 0;
  ALTER TABLE leases ADD COLUMN period_start bigint NOT NULL DEFAULT 0;
  CREATE TABLE budget_periods (
    key_id        text NOT NULL REFERENCES keys(id),
    period_start  bigint NOT NULL,
    period_end    bigint NOT NULL,
    budget_tokens bigint NOT NULL CHECK (budget_tokens >= 0),
    spent_tokens  bigint NOT NULL DEFAULT 0 CHECK (spent_tokens >= 0),
    held_tokens   bigint NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    leased_tokens bigint NOT NULL DEFAULT 0 CHECK (leased_tokens >= 0),
    CHECK (spent_tokens + held_tokens + leased_tokens <= budget_tokens),
    PRIMARY KEY (key_id, period_start)
  );
  `,
  // 2 → 3: one row per settled request (src/budget/README.md, "Usage records"); no foreign key
  // on key_id, so that a flush never fails on a key and the table outlives what happens to keys.
  `
  CREATE TABLE usage_records (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key_id            text NOT NULL,
    model             text NOT NULL,
    input_tokens      bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens     bigint NOT NULL CHECK (output_tokens >= 0),
    activation_tokens bigint NOT NULL CHECK (activation_tokens >= 0),
    charged_tokens    bigint NOT NULL CHECK (charged_tokens >= 0),
    status            integer NOT NULL,
    request_id        text NOT NULL,
    created_at        bigint NOT NULL
  );
  CREATE INDEX usage_records_by_time ON usage_records (created_at);
  CREATE INDEX usage_records_by_key ON usage_records (key_id, created_at);
  CREATE INDEX usage_records_by_model ON usage_records (model, created_at);
  `,
  // 3 → 4: the admin surface — a key's rate limits, expiry and metadata; admin keys; the audit log
  // (append-only: a trigger refuses every UPDATE and DELETE of its rows).
  `
  ALTER TABLE keys
    ADD COLUMN rate_limits jsonb CHECK (rate_limits IS NULL OR jsonb_typeof(rate_limits) = 'object'),
    ADD COLUMN expires_at bigint,
    ADD COLUMN metadata jsonb CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object');
  CREATE INDEX keys_by_created ON keys (created_at, id);
  CREATE TABLE admin_keys (
    id         text PRIMARY KEY,
    key_hash   bytea NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
    hint       text NOT NULL,
    name       text NOT NULL DEFAULT '',
    created_at bigint NOT NULL,
    revoked_at bigint
  );
  CREATE TABLE audit_logs (
    seq       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id        text NOT NULL UNIQUE,
    at        bigint NOT NULL,
    actor     text NOT NULL,
    action    text NOT NULL,
    target_id text NOT NULL,
    before    jsonb,
    after     jsonb
  );
  CREATE FUNCTION acs_audit_logs_append_only() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RAISE EXCEPTION 'audit_logs is append-only'; END $$;
  CREATE TRIGGER audit_logs_append_only BEFORE UPDATE OR DELETE ON audit_logs
    FOR EACH ROW EXECUTE FUNCTION acs_audit_logs_append_only();
  `,
];

/** The schema version this code writes on PostgreSQL (table `budget_schema_migrations`). */
export const POSTGRES_BUDGET_SCHEMA_VERSION: number = MIGRATIONS.length;

/** pg_advisory_xact_lock key that serializes migrations of replicas starting at once. */
const MIGRATION_LOCK = 0x616373_627564; // "acs" "bud"

/**
 * Brings the schema of the pool's database to {@link POSTGRES_BUDGET_SCHEMA_VERSION}, in one
 * transaction; throws when the database has a newer schema (or a statement fails: rolled back).
 */
export async function migrate(pool: pg.Pool): Promise<void> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    await client.query("BEGIN");
    await client.query("SELECT pg_advisory_xact_lock($1)", [MIGRATION_LOCK]);
    await client.query(
      "CREATE TABLE IF NOT EXISTS budget_schema_migrations (version integer PRIMARY KEY, applied_at bigint NOT NULL)",
    );
    const { rows } = await client.query<{ v: number }>(
      "SELECT coalesce(max(version), 0)::bigint AS v FROM budget_schema_migrations",
    );
    const version = rows[0]?.v ?? 0;
    if (version > POSTGRES_BUDGET_SCHEMA_VERSION) {
      throw schemaTooNewError(version, POSTGRES_BUDGET_SCHEMA_VERSION);
    }
    for (let v = version; v < POSTGRES_BUDGET_SCHEMA_VERSION; v++) {
      await client.query(MIGRATIONS[v] ?? "");
      await client.query("INSERT INTO budget_schema_migrations (version, applied_at) VALUES ($1, $2)", [
        v + 1,
        Date.now(),
      ]);
    }
    await client.query("COMMIT");
  } catch (err) {
    try {
      await client.query("ROLLBACK");
    } catch (rollbackError) {
      broken = rollbackError as Error;
    }
    throw err;
  } finally {
    client.release(broken);
  }
}
