// The keys CLI's command line (src/budget/cli.ts): its help, its options, and every command checked
// before the database is opened (a mistake is a UsageError, exit code 2).
import { parseArgs } from "node:util";
import type { KeyMetadata } from "./key-settings.js";
import { BUDGET_PERIODS, type BudgetPeriod, isBudgetPeriod } from "./period.js";

export const HELP = `Usage: npm run keys -- <command> [options]

Keys and Budgets of the API, in the database named by ACS_DB (or --db): a SQLite file
path, or a PostgreSQL URL (postgres://user@host:5432/database) shared by gateway replicas.
Every change is written to the audit log (actor: cli), as the admin API's are.

Commands:
  create --budget TOKENS [--name NAME] [--models ID,ID...] [--period none|day|week|month]
         [KEY SETTINGS]  Create a key with a Budget of TOKENS; prints the key once.
                         With --period, TOKENS is the Budget of each UTC day, ISO week
                         (from Monday) or month: spent starts again from 0 at each boundary.
  update <id> [--name NAME] [--budget TOKENS] [--models ID,ID...|all] [KEY SETTINGS]
                         Change a key: --budget sets its Budget (not below what it has
                         spent or holds), --models all lifts the allow-list.
  list                   List every key (id, name, Budget, spent, state).
  grant <id> --tokens N  Add N tokens to the key's Budget.
  rotate <id>            Give the key a new secret (same id, Budget and usage); prints it
                         once. The old secret gets 401 within 1 s on every replica.
  revoke <id>            Revoke the key: every request with it gets 401 from now on
                         (waits until the replicas leasing the key have confirmed it).
  usage <id> [--days N]  Show the key's Budget, spent, held, leased and available tokens,
                         and its usage per day (UTC) for the last N days (default 31);
                         with a period, its start, its reset time and the past periods.
  create-admin [--name NAME]
                         Create an admin key (acs-admin-…) for the admin API
                         (/v1/admin/…, acs.v1.AdminService); prints it once.
  revoke-admin <id>      Revoke an admin key (refused at once on every replica).
  audit [--limit N]      Show the last N audit log entries, newest first (default 20, ≤ 100).
  help                   Show this help.

Key settings (create, update):
  --rpm N                Requests per minute for the key (N ≥ 1; update: 'none' lifts it).
  --tpm N                Tokens per minute for the key (N ≥ 1; update: 'none' lifts it).
  --expires-at TIME      When the key stops working: an ISO 8601 time (2027-01-31T00:00:00Z)
                         or Unix epoch milliseconds; update: 'never' lifts it.
  --metadata KEY=VALUE   A metadata pair (repeat: at most 16; keys ≤ 64 characters, values
                         ≤ 512); update: replaces the key's metadata ('--metadata none' clears it).

Options:
  --db PATH|URL          SQLite file (created when missing) or postgres:// URL (default: $ACS_DB).
  --json                 Print JSON instead of text.
  -h, --help             Show this help.

Exit codes: 0 done, 1 the command failed, 2 wrong usage or a database that cannot be opened.
`;

/** A mistake of the command line (exit code 2). */
export class UsageError extends Error {}

export function parse(argv: readonly string[]) {
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
      rpm: { type: "string" },
      tpm: { type: "string" },
      "expires-at": { type: "string" },
      metadata: { type: "string", multiple: true },
      limit: { type: "string" },
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
}

export type Values = ReturnType<typeof parse>["values"];

/** A per-minute limit of the command line: a number, or `null` to lift it (update's 'none'). */
type Limit = number | null;

/** The key settings of create and update, as given (undefined: not given). */
export interface SettingArgs {
  readonly rpm?: Limit;
  readonly tpm?: Limit;
  readonly expiresAt?: number | null;
  readonly metadata?: KeyMetadata | null;
}

/** A command line, checked: every value parsed before the database is opened. */
export type Command =
  | ({
      readonly kind: "create";
      readonly budgetTokens: number;
      readonly name?: string;
      readonly models?: string[];
      readonly period?: BudgetPeriod;
    } & SettingArgs)
  | ({
      readonly kind: "update";
      readonly id: string;
      readonly name?: string;
      readonly budgetTokens?: number;
      readonly models?: string[] | null;
    } & SettingArgs)
  | { readonly kind: "list" }
  | { readonly kind: "grant"; readonly id: string; readonly tokens: number }
  | { readonly kind: "rotate" | "revoke" | "revoke-admin"; readonly id: string }
  | { readonly kind: "usage"; readonly id: string; readonly days: number }
  | { readonly kind: "create-admin"; readonly name?: string }
  | { readonly kind: "audit"; readonly limit: number };

const SETTINGS = ["rpm", "tpm", "expires-at", "metadata"] as const;
const ALLOWED: Record<string, { args: number; options: readonly (keyof Values)[] }> = {
  create: { args: 0, options: ["budget", "name", "models", "period", ...SETTINGS] },
  update: { args: 1, options: ["budget", "name", "models", ...SETTINGS] },
  list: { args: 0, options: [] },
  grant: { args: 1, options: ["tokens"] },
  rotate: { args: 1, options: [] },
  revoke: { args: 1, options: [] },
  usage: { args: 1, options: ["days"] },
  "create-admin": { args: 0, options: ["name"] },
  "revoke-admin": { args: 1, options: [] },
  audit: { args: 0, options: ["limit"] },
};
const CHECKED = ["budget", "name", "models", "period", "tokens", "days", "limit", ...SETTINGS] as const;

/** The checked command, or "help"; throws UsageError with the reason. */
export function toCommand(positionals: readonly string[], values: Values): Command | "help" {
  const name = positionals[0];
  if (name === "help") return "help";
  if (name === undefined) throw new UsageError(`no command (${Object.keys(ALLOWED).join(", ")})`);
  const spec = ALLOWED[name];
  if (spec === undefined) throw new UsageError(`unknown command '${name}'`);
  if (positionals.length - 1 !== spec.args) {
    throw new UsageError(
      spec.args === 0 ? `'${name}' takes no arguments` : `'${name}' takes the key id: ${name} <id>`,
    );
  }
  for (const option of CHECKED) {
    if (values[option] !== undefined && !spec.options.includes(option)) {
      throw new UsageError(`'${name}' has no option --${option}`);
    }
  }
  const id = positionals[1] ?? "";
  switch (name) {
    case "create":
      return createCommand(values);
    case "update":
      return updateCommand(id, values);
    case "grant":
      if (values.tokens === undefined) throw new UsageError("'grant' needs --tokens N");
      return { kind: "grant", id, tokens: count("--tokens", values.tokens, 1) };
    case "rotate":
    case "revoke":
    case "revoke-admin":
      return { kind: name, id };
    case "usage":
      return { kind: name, id, days: values.days === undefined ? 31 : count("--days", values.days, 1) };
    case "create-admin":
      return { kind: name, ...(values.name === undefined ? {} : { name: values.name }) };
    case "audit": {
      const limit = values.limit === undefined ? 20 : count("--limit", values.limit, 1);
      if (limit > 100) throw new UsageError(`--limit must be at most 100, got '${values.limit}'`);
      return { kind: name, limit };
    }
    default:
      return { kind: "list" };
  }
}

function createCommand(values: Values): Command {
  if (values.budget === undefined) throw new UsageError("'create' needs --budget TOKENS");
  const models = modelList(values.models);
  const { period } = values;
  if (period !== undefined && !isBudgetPeriod(period)) {
    throw new UsageError(`--period must be one of ${BUDGET_PERIODS.join(", ")}, got '${period}'`);
  }
  return {
    kind: "create",
    budgetTokens: count("--budget", values.budget, 0),
    ...(values.name === undefined ? {} : { name: values.name }),
    ...(models === undefined ? {} : { models }),
    ...(period === undefined ? {} : { period }),
    ...settingArgs(values, false),
  };
}

function updateCommand(id: string, values: Values): Command {
  const models = values.models === "all" ? null : modelList(values.models);
  const command: Command = {
    kind: "update",
    id,
    ...(values.name === undefined ? {} : { name: values.name }),
    ...(values.budget === undefined ? {} : { budgetTokens: count("--budget", values.budget, 0) }),
    ...(models === undefined ? {} : { models }),
    ...settingArgs(values, true),
  };
  if (Object.keys(command).length === 2)
    throw new UsageError("'update' needs something to change (see --help)");
  return command;
}

function modelList(text: string | undefined): string[] | undefined {
  const models = text?.split(",").map((m) => m.trim());
  if (models?.some((m) => m === "")) throw new UsageError("--models: a model id must not be empty");
  return models;
}

/** --rpm, --tpm, --expires-at and --metadata, parsed (`lift`: update's 'none' and 'never' allowed). */
function settingArgs(values: Values, lift: boolean): SettingArgs {
  const limit = (flag: string, text: string | undefined): { value?: Limit } => {
    if (text === undefined) return {};
    if (lift && text === "none") return { value: null };
    return { value: count(flag, text, 1) };
  };
  const rpm = limit("--rpm", values.rpm);
  const tpm = limit("--tpm", values.tpm);
  const at = values["expires-at"];
  return {
    ...("value" in rpm ? { rpm: rpm.value as Limit } : {}),
    ...("value" in tpm ? { tpm: tpm.value as Limit } : {}),
    ...(at === undefined ? {} : { expiresAt: lift && at === "never" ? null : time(at) }),
    ...(values.metadata === undefined ? {} : { metadata: metadataOf(values.metadata, lift) }),
  };
}

/** An ISO 8601 time or Unix epoch milliseconds, as ms. */
function time(text: string): number {
  const ms = /^[0-9]+$/.test(text)
    ? Number(text)
    : /^\d{4}-\d{2}-\d{2}/.test(text)
      ? Date.parse(text)
      : Number.NaN;
  if (!Number.isSafeInteger(ms)) {
    throw new UsageError(`--expires-at must be an ISO 8601 time or Unix epoch milliseconds, got '${text}'`);
  }
  return ms;
}

function metadataOf(pairs: readonly string[], lift: boolean): KeyMetadata | null {
  if (lift && pairs.length === 1 && pairs[0] === "none") return null;
  const entries = pairs.map((pair): [string, string] => {
    const eq = pair.indexOf("=");
    if (eq < 1) throw new UsageError(`--metadata takes KEY=VALUE, got '${pair}'`);
    return [pair.slice(0, eq), pair.slice(eq + 1)];
  });
  return Object.fromEntries(entries); // own properties, `__proto__` included
}

/** A whole number ≥ min of a flag's text; UsageError otherwise. */
export function count(flag: string, text: string, min: number): number {
  const value = /^[0-9]+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min) {
    const what = flag === "--days" ? "days" : flag === "--budget" || flag === "--tokens" ? "tokens" : "";
    throw new UsageError(
      `${flag} must be a whole number${what === "" ? "" : ` of ${what}`} ≥ ${min}, got '${text}'`,
    );
  }
  return value;
}
