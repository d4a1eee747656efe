import type { BudgetDb } from "./config.js";
import { ConfigError } from "./config-error.js";

/**
 * The keys database as it may be shown: a postgres:// URL with its password (in the user part or
 * a `password=` parameter) as ***; a SQLite path as it is.
 */
export function redactDb(db: string): string {
  if (!/^postgres(ql)?:\/\//i.test(db)) return db;
  try {
    const url = new URL(db);
    if (url.password !== "") url.password = "***";
    if (url.searchParams.has("password")) url.searchParams.set("password", "***");
    return url.href;
  } catch {
    // Not a URL: nothing after the scheme is shown but the user (the password may be anywhere).
    return db.replace(/^(postgres(?:ql)?:\/\/[^:/@]*)[\s\S]*$/i, "$1:***");
  }
}

/** Errors of the code itself: they keep their stack trace. */
const codeErrors = [TypeError, RangeError, ReferenceError, SyntaxError];

interface ErrorFields {
  readonly code?: unknown;
  readonly severity?: unknown;
  readonly address?: unknown;
  readonly port?: unknown;
  readonly errors?: unknown;
}

/** The host a postgres:// URL names. */
function hostOf(db: string): string {
  try {
    return new URL(db).hostname || "localhost";
  } catch {
    return "of the URL";
  }
}

/** Where a connection went: the address and port of the (first) socket error, else the URL's. */
function serverOf(err: ErrorFields, db: string): string {
  const first = (Array.isArray(err.errors) ? err.errors[0] : err) as ErrorFields | undefined;
  if (typeof first?.address === "string" && typeof first.port === "number") {
    return `${first.address}:${first.port}`;
  }
  try {
    return `${hostOf(db)}:${new URL(db).port || "5432"}`;
  } catch {
    return "the server";
  }
}

/** What went wrong, in words, for an error opening the database. */
function reasonOf(err: Error & ErrorFields, db: string): string {
  const code = typeof err.code === "string" ? err.code : "";
  if (code === "ECONNREFUSED")
    return `no PostgreSQL server answers at ${serverOf(err, db)} (connection refused)`;
  if (code === "ENOTFOUND" || code === "EAI_AGAIN") return `the host ${hostOf(db)} is not found (${code})`;
  if (code === "ETIMEDOUT" || code === "EHOSTUNREACH" || code === "ENETUNREACH") {
    return `cannot reach ${serverOf(err, db)} (${code})`;
  }
  // pg's DatabaseError: the server's own words (no such database, role or password refused).
  if (typeof err.severity === "string") return `PostgreSQL refused: ${err.message}`;
  if (err.name === "SqliteError" || code.startsWith("SQLITE_")) {
    return `cannot open the SQLite file: ${err.message}`;
  }
  return `cannot open the database: ${err.message}`;
}

/**
 * An error met opening the keys database at start-up (PostgreSQL: no server, no such host or
 * database, a login refused; SQLite: not a database, cannot be opened) as a one-line ConfigError
 * naming `name` (ACS_DB, or the keys CLI's --db) and the database without its password; undefined
 * for an error of the code's own (TypeError, RangeError…), which keeps its stack trace.
 */
export function dbOpenError(err: unknown, db: string | BudgetDb, name = "ACS_DB"): ConfigError | undefined {
  if (typeof db !== "string") return dbOpenError(err, db.kind === "postgres" ? db.url : db.path, name);
  if (!(err instanceof Error) || codeErrors.some((type) => err instanceof type)) return undefined;
  const reason = reasonOf(err, db).replace(/\s*\n\s*/g, " ");
  return new ConfigError(`${name}=${redactDb(db)}: ${reason}`);
}
