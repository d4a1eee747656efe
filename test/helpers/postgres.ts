// PostgreSQL for tests: the machine's real server (127.0.0.1:5432, user postgres, trust auth, or
// ACS_TEST_POSTGRES_URL), a fresh database per test file. Without a server the PostgreSQL tests
// are skipped with the reason — unless ACS_TEST_POSTGRES=required (.ci/run sets it), which makes
// them fail instead.
import { randomBytes } from "node:crypto";
import pg from "pg";

/** The maintenance database tests connect to, to create and drop their own. */
export const POSTGRES_ADMIN_URL =
  process.env.ACS_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";

/** Set by .ci/run: a missing PostgreSQL fails the run instead of skipping its tests. */
export const POSTGRES_REQUIRED = process.env.ACS_TEST_POSTGRES === "required";

let probe: Promise<string | undefined> | undefined;

/** Undefined when PostgreSQL answers; else why not (one probe per process). */
export function postgresUnavailable(): Promise<string | undefined> {
  probe ??= (async () => {
    const client = new pg.Client({ connectionString: POSTGRES_ADMIN_URL, connectionTimeoutMillis: 3000 });
    client.on("error", () => undefined);
    try {
      await client.connect();
      await client.query("SELECT 1");
      return undefined;
    } catch (err) {
      return `PostgreSQL is unreachable at ${redact(POSTGRES_ADMIN_URL)} (${(err as Error).message})`;
    } finally {
      await client.end().catch(() => undefined);
    }
  })();
  return probe;
}

function redact(url: string): string {
  return url.replace(/:\/\/([^:/@]*):[^@]*@/, "://$1:***@");
}

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: POSTGRES_ADMIN_URL });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** A database of one test file: created by `create()`, dropped (with its connections) by `drop()`. */
export interface TestDatabase {
  /** postgres:// URL of the database; throws before create() or when PostgreSQL is unavailable. */
  readonly url: string;
  /** Why the PostgreSQL tests of this file are skipped, or undefined. */
  readonly skipReason: string | undefined;
  create(): Promise<void>;
  /** Empties every budget table (between tests of one file). */
  truncate(): Promise<void>;
  drop(): Promise<void>;
}

/**
 * A fresh database named after `label`. Call create() in beforeAll and drop() in afterAll; in a
 * test (or beforeEach), `if (db.skipReason) ctx.skip(db.skipReason)`. create() throws when
 * PostgreSQL is unreachable and ACS_TEST_POSTGRES=required.
 */
export function testDatabase(label: string): TestDatabase {
  const name = `acs_test_${label.replace(/[^a-z0-9_]/gi, "_").toLowerCase()}_${randomBytes(4).toString("hex")}`;
  let url: string | undefined;
  let skipReason: string | undefined;
  let created = false;
  return {
    get url() {
      if (url === undefined) throw new Error(skipReason ?? "the test database is not created yet");
      return url;
    },
    get skipReason() {
      return skipReason;
    },
    async create() {
      const reason = await postgresUnavailable();
      if (reason !== undefined) {
        if (POSTGRES_REQUIRED) throw new Error(`${reason}; ACS_TEST_POSTGRES=required`);
        skipReason = `${reason}: PostgreSQL tests skipped`;
        return;
      }
      await admin((c) => c.query(`CREATE DATABASE ${name}`));
      created = true;
      const u = new URL(POSTGRES_ADMIN_URL);
      u.pathname = `/${name}`;
      url = u.toString();
    },
    async truncate() {
      if (url === undefined) return;
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        const { rows } = await client.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_tables WHERE tablename = 'keys'",
        );
        if (rows[0]?.n)
          await client.query(
            "DELETE FROM usage_daily; DELETE FROM budget_periods; DELETE FROM holds; DELETE FROM leases; " +
              "DELETE FROM keys; DELETE FROM usage_records",
          );
        // The admin tables (schema 2 on): audit_logs refuses DELETE (append-only), TRUNCATE empties it.
        const admin = await client.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_tables WHERE tablename = 'audit_logs'",
        );
        if (admin.rows[0]?.n) await client.query("TRUNCATE audit_logs, admin_keys");
      } finally {
        await client.end();
      }
    },
    async drop() {
      if (!created) return;
      await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}
