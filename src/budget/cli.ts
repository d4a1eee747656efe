/**
 * `npm run keys -- <command>` (compiled: dist/src/budget/cli.js; `npm run keys:dev` runs this
 * file with tsx): administers keys and Budgets in the gateway's database: a SQLite
 * file or PostgreSQL (ACS_DB=postgres://…). The only place under src/budget that reads
 * process.env (ACS_DB). Exit codes: 0 done, 1 the command failed (e.g. unknown key id), 2 wrong
 * usage or a database that cannot be opened (one line, as the gateway's start-up says it).
 */
import { parseArgs } from "node:util";
import { checkDbPath } from "../config/check-db-path.js";
import { ConfigError } from "../config/config-error.js";
import { dbOpenError, redactDb } from "../config/db-open-error.js";
import {
  BUDGET_PERIODS,
  type BudgetLedger,
  type BudgetPeriod,
  createBudgetLedger,
  isBudgetPeriod,
  isPostgresUrl,
  type KeySummary,
  type KeyUsage,
  UnknownIdError,
} from "./index.js";

const HELP = `Usage: npm run keys -- <command> [options]

Keys and Budgets of the API, in the database named by ACS_DB (or --db): a SQLite file
path, or a PostgreSQL URL (postgres://user@host:5432/database) shared by gateway replicas.

Commands:
  create --budget TOKENS [--name NAME] [--models ID,ID...] [--period none|day|week|month]
                         Create a key with a Budget of TOKENS; prints the key once.
                         With --period, TOKENS is the Budget of each UTC day, ISO week
                         (from Monday) or month: spent starts again from 0 at each boundary.
  list                   List every key (id, name, Budget, spent, state).
  grant <id> --tokens N  Add N tokens to the key's Budget.
  revoke <id>            Revoke the key: every request with it gets 401 from now on
                         (waits until the replicas leasing the key have confirmed it).
  usage <id> [--days N]  Show the key's Budget, spent, held, leased and available tokens,
                         and its usage per day (UTC) for the last N days (default 31);
                         with a period, its start, its reset time and the past periods.
  help                   Show this help.

Options:
  --db PATH|URL          SQLite file (created when missing) or postgres:// URL (default: $ACS_DB).
  --json                 Print JSON instead of text.
  -h, --help             Show this help.

Exit codes: 0 done, 1 the command failed, 2 wrong usage or a database that cannot be opened.
`;

class UsageError extends Error {}

interface Io {
  out(line: string): void;
  err(line: string): void;
}

async function main(argv: readonly string[], env: NodeJS.ProcessEnv, io: Io): Promise<number> {
  let command: Command | "help";
  let values: Values;
  try {
    const parsed = parse(argv);
    values = parsed.values;
    command = values.help === true ? "help" : toCommand(parsed.positionals, values);
  } catch (err) {
    io.err(`error: ${err instanceof Error ? err.message : String(err)}`);
    io.err("Run with --help for usage.");
    return 2;
  }
  if (command === "help") {
    io.out(HELP.trimEnd());
    return 0;
  }
  const db = values.db ?? env.ACS_DB;
  if (db === undefined || db === "") {
    io.err("error: no database: set ACS_DB to the SQLite file or postgres:// URL, or pass --db PATH|URL");
    return 2;
  }
  // A database that cannot be opened is a mistake of the command line: one line, exit code 2.
  const name = values.db === undefined ? "ACS_DB" : "--db";
  let ledger: BudgetLedger;
  try {
    const common = { reclaimIntervalMs: 0, leases: false } as const;
    if (!isPostgresUrl(db)) checkDbPath(db, name);
    ledger = await createBudgetLedger(
      isPostgresUrl(db) ? { ...common, postgresUrl: db, poolSize: 1 } : { ...common, path: db },
    );
  } catch (err) {
    const refusal = err instanceof ConfigError ? err : dbOpenError(err, db, name);
    if (refusal !== undefined) {
      io.err(`error: ${refusal.message}`);
      return 2;
    }
    io.err(`error: cannot open the database '${redactDb(db)}': ${String(err)}`);
    return 1;
  }
  try {
    await run(ledger, command, values.json === true, io);
    return 0;
  } catch (err) {
    io.err(`error: ${err instanceof UnknownIdError ? err.message : String(err)}`);
    return 1;
  } finally {
    await ledger.close();
  }
}

function parse(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    allowPositionals: true,
    strict: true,
    options: {
      db: { type: "string" },
      budget: { type: "string" },
      name: { type: "string" },
      models: { type: "string" },
      period: { type: "string" },
      tokens: { type: "string" },
      days: { type: "string" },
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
}

type Values = ReturnType<typeof parse>["values"];

/** A command line, checked: every value parsed before the database is opened. */
type Command =
  | {
      readonly kind: "create";
      readonly budgetTokens: number;
      readonly name?: string;
      readonly models?: string[];
      readonly period?: BudgetPeriod;
    }
  | { readonly kind: "list" }
  | { readonly kind: "grant"; readonly id: string; readonly tokens: number }
  | { readonly kind: "revoke"; readonly id: string }
  | { readonly kind: "usage"; readonly id: string; readonly days: number };

const ALLOWED: Record<string, { args: number; options: readonly (keyof Values)[] }> = {
  create: { args: 0, options: ["budget", "name", "models", "period"] },
  list: { args: 0, options: [] },
  grant: { args: 1, options: ["tokens"] },
  revoke: { args: 1, options: [] },
  usage: { args: 1, options: ["days"] },
};

/** The checked command, or "help"; throws UsageError with the reason. */
function toCommand(positionals: readonly string[], values: Values): Command | "help" {
  const name = positionals[0];
  if (name === "help") return "help";
  if (name === undefined) throw new UsageError("no command (create, list, grant, revoke, usage)");
  const spec = ALLOWED[name];
  if (spec === undefined) throw new UsageError(`unknown command '${name}'`);
  if (positionals.length - 1 !== spec.args) {
    throw new UsageError(
      spec.args === 0 ? `'${name}' takes no arguments` : `'${name}' takes the key id: ${name} <id>`,
    );
  }
  for (const option of ["budget", "name", "models", "period", "tokens", "days"] as const) {
    if (values[option] !== undefined && !spec.options.includes(option)) {
      throw new UsageError(`'${name}' has no option --${option}`);
    }
  }
  const id = positionals[1] ?? "";
  switch (name) {
    case "create": {
      if (values.budget === undefined) throw new UsageError("'create' needs --budget TOKENS");
      const models = values.models?.split(",").map((m) => m.trim());
      if (models?.some((m) => m === "")) throw new UsageError("--models: a model id must not be empty");
      const { period } = values;
      if (period !== undefined && !isBudgetPeriod(period)) {
        throw new UsageError(`--period must be one of ${BUDGET_PERIODS.join(", ")}, got '${period}'`);
      }
      return {
        kind: "create",
        budgetTokens: tokenCount("--budget", values.budget, 0),
        ...(values.name === undefined ? {} : { name: values.name }),
        ...(models === undefined ? {} : { models }),
        ...(period === undefined ? {} : { period }),
      };
    }
    case "grant":
      if (values.tokens === undefined) throw new UsageError("'grant' needs --tokens N");
      return { kind: "grant", id, tokens: tokenCount("--tokens", values.tokens, 1) };
    case "revoke":
      return { kind: name, id };
    case "usage":
      return { kind: name, id, days: values.days === undefined ? 31 : tokenCount("--days", values.days, 1) };
    default:
      return { kind: "list" };
  }
}

async function run(ledger: BudgetLedger, command: Command, json: boolean, io: Io): Promise<void> {
  switch (command.kind) {
    case "create": {
      const { budgetTokens, name, models, period } = command;
      const created = await ledger.createKey({
        budgetTokens,
        ...(name === undefined ? {} : { name }),
        ...(models === undefined ? {} : { models }),
        ...(period === undefined ? {} : { period }),
      });
      if (json) {
        io.out(JSON.stringify({ ...created, ...(await ledger.usage(created.id)) }));
      } else {
        io.out(`Created key ${created.id}${name === undefined ? "" : ` (${name})`}`);
        const per = period === undefined || period === "none" ? "" : ` a ${period} (UTC)`;
        io.out(
          `Budget: ${budgetTokens} tokens${per}; models: ${models === undefined ? "all" : models.join(", ")}`,
        );
        io.out("The key is shown only this once; store it now:");
        io.out(created.key);
      }
      return;
    }
    case "list": {
      const keys = await ledger.listKeys();
      if (json) io.out(JSON.stringify(keys));
      else printTable(keys, io);
      return;
    }
    case "grant":
      printUsage(await ledger.grant(command.id, command.tokens), json, io);
      return;
    case "revoke": {
      const summary = await ledger.revoke(command.id);
      if (json) io.out(JSON.stringify(summary));
      else io.out(`Revoked key ${summary.id} at ${new Date(summary.revokedAt ?? 0).toISOString()}`);
      return;
    }
    case "usage":
      printUsage(await ledger.usage(command.id, command.days), json, io);
      return;
  }
}

function tokenCount(flag: string, text: string, min: number): number {
  const value = /^[0-9]+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min) {
    const what = flag === "--days" ? "days" : "tokens";
    throw new UsageError(`${flag} must be a whole number of ${what} ≥ ${min}, got '${text}'`);
  }
  return value;
}

function printUsage(usage: KeyUsage, json: boolean, io: Io): void {
  if (json) {
    io.out(JSON.stringify(usage));
    return;
  }
  io.out(`Key ${usage.id}${usage.name === "" ? "" : ` (${usage.name})`} ${usage.hint}`);
  io.out(
    `  state:      ${usage.revokedAt === null ? "live" : `revoked ${new Date(usage.revokedAt).toISOString()}`}`,
  );
  io.out(`  models:     ${usage.models === null ? "all" : usage.models.join(", ")}`);
  io.out(`  budget:     ${usage.budgetTokens}${usage.period === undefined ? "" : ` a ${usage.period}`}`);
  if (usage.period !== undefined) {
    const iso = (ms: number | undefined) => new Date(ms ?? 0).toISOString();
    io.out(`  period:     from ${iso(usage.periodStart)}, resets at ${iso(usage.resetsAt)}`);
  }
  io.out(`  spent:      ${usage.spentTokens}`);
  io.out(`  held:       ${usage.heldTokens} (${usage.openHolds} open Holds)`);
  io.out(`  leased:     ${usage.leasedTokens} (${usage.leases} leases of gateway replicas)`);
  io.out(`  available:  ${usage.availableTokens}`);
  io.out(`  requests:   ${usage.settledHolds} settled, ${usage.reclaimedHolds} reclaimed`);
  printPeriods(usage, io);
  if (usage.daily.length === 0) return;
  io.out("  per day (UTC):");
  const rows = [
    ["DAY", "CHARGED", "SETTLED", "RECLAIMED"],
    ...usage.daily.map((d) => [
      d.day,
      String(d.chargedTokens),
      String(d.settledHolds),
      String(d.reclaimedHolds),
    ]),
  ];
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  const pad = (cell: string, i: number) =>
    i === 0 ? cell.padEnd(widths[i] ?? 0) : cell.padStart(widths[i] ?? 0);
  for (const row of rows) io.out(`    ${row.map(pad).join("  ")}`);
}

/** The past periods of a key with a Budget period (the newest first). */
function printPeriods(usage: KeyUsage, io: Io): void {
  if (usage.periods === undefined || usage.periods.length === 0) return;
  io.out("  past periods (UTC):");
  for (const p of usage.periods) {
    const still = p.heldTokens + p.leasedTokens;
    io.out(
      `    ${new Date(p.periodStart).toISOString()}  budget ${p.budgetTokens}  spent ${p.spentTokens}` +
        (still > 0 ? `  still held ${still}` : ""),
    );
  }
}

function printTable(keys: readonly KeySummary[], io: Io): void {
  if (keys.length === 0) {
    io.out("No keys.");
    return;
  }
  const rows = [
    ["ID", "NAME", "KEY", "BUDGET", "SPENT", "STATE", "MODELS", "CREATED"],
    ...keys.map((k) => [
      k.id,
      k.name,
      k.hint,
      `${k.budgetTokens}${k.period === undefined ? "" : `/${k.period}`}`,
      String(k.spentTokens),
      k.revokedAt === null ? "live" : "revoked",
      k.models === null ? "all" : k.models.join(","),
      new Date(k.createdAt).toISOString(),
    ]),
  ];
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  for (const row of rows)
    io.out(
      row
        .map((cell, i) => cell.padEnd(widths[i] ?? 0))
        .join("  ")
        .trimEnd(),
    );
}

// A reader that stops early (`npm run keys -- list | head`) closes the pipe: the rest of the
// output has nowhere to go, which is not an error (as `ls | head` is not).
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code === "EPIPE") process.exit(process.exitCode ?? 0);
  throw err;
});

process.exitCode = await main(process.argv.slice(2), process.env, {
  out: (line) => process.stdout.write(`${line}\n`),
  err: (line) => process.stderr.write(`${line}\n`),
});
