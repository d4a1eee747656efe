/**
 * `npm run keys -- <command>`: administers keys and Budgets in the gateway's SQLite file.
 * The only place under src/budget that reads process.env (ACS_DB). Exit codes: 0 done, 1 the
 * command failed (e.g. unknown key id), 2 wrong usage.
 */
import { parseArgs } from "node:util";
import {
  type BudgetLedger,
  createBudgetLedger,
  type KeySummary,
  type KeyUsage,
  UnknownIdError,
} from "./index.js";

const HELP = `Usage: npm run keys -- <command> [options]

Keys and Budgets of the API, in the SQLite file named by ACS_DB (or --db PATH).

Commands:
  create --budget TOKENS [--name NAME] [--models ID,ID...]
                         Create a key with a Budget of TOKENS; prints the key once.
  list                   List every key (id, name, Budget, spent, state).
  grant <id> --tokens N  Add N tokens to the key's Budget.
  revoke <id>            Revoke the key: every request with it gets 401 from now on.
  usage <id>             Show the key's Budget, spent, held and available tokens.
  help                   Show this help.

Options:
  --db PATH              SQLite file (default: $ACS_DB); created when missing.
  --json                 Print JSON instead of text.
  -h, --help             Show this help.

Exit codes: 0 done, 1 the command failed, 2 wrong usage.
`;

class UsageError extends Error {}

interface Io {
  out(line: string): void;
  err(line: string): void;
}

function main(argv: readonly string[], env: NodeJS.ProcessEnv, io: Io): number {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (err) {
    io.err(`error: ${err instanceof Error ? err.message : String(err)}`);
    io.err("Run with --help for usage.");
    return 2;
  }
  const { values, positionals } = parsed;
  const command = positionals[0];
  if (values.help === true || command === "help") {
    io.out(HELP.trimEnd());
    return 0;
  }
  if (command === undefined) {
    io.err(HELP.trimEnd());
    return 2;
  }
  const dbPath = values.db ?? env.ACS_DB;
  let ledger: BudgetLedger | undefined;
  try {
    checkCommand(command, positionals, values);
    if (dbPath === undefined || dbPath === "") {
      throw new UsageError("no database: set ACS_DB to the SQLite file, or pass --db PATH");
    }
    ledger = createBudgetLedger({ path: dbPath, reclaimIntervalMs: 0 });
    run(ledger, command, positionals, values, io);
    return 0;
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`error: ${err.message}`);
      io.err("Run with --help for usage.");
      return 2;
    }
    io.err(`error: ${err instanceof UnknownIdError ? err.message : String(err)}`);
    return 1;
  } finally {
    ledger?.close();
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
      tokens: { type: "string" },
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
}

type Values = ReturnType<typeof parse>["values"];

const ALLOWED: Record<string, { args: number; options: readonly (keyof Values)[] }> = {
  create: { args: 0, options: ["budget", "name", "models"] },
  list: { args: 0, options: [] },
  grant: { args: 1, options: ["tokens"] },
  revoke: { args: 1, options: [] },
  usage: { args: 1, options: [] },
};

function checkCommand(command: string, positionals: readonly string[], values: Values): void {
  const spec = ALLOWED[command];
  if (spec === undefined) throw new UsageError(`unknown command '${command}'`);
  const args = positionals.length - 1;
  if (args !== spec.args) {
    throw new UsageError(
      spec.args === 0 ? `'${command}' takes no arguments` : `'${command}' takes the key id: ${command} <id>`,
    );
  }
  for (const option of ["budget", "name", "models", "tokens"] as const) {
    if (values[option] !== undefined && !spec.options.includes(option)) {
      throw new UsageError(`'${command}' has no option --${option}`);
    }
  }
}

function run(
  ledger: BudgetLedger,
  command: string,
  positionals: readonly string[],
  values: Values,
  io: Io,
): void {
  const id = positionals[1] ?? "";
  const json = values.json === true;
  switch (command) {
    case "create": {
      if (values.budget === undefined) throw new UsageError("'create' needs --budget TOKENS");
      const budgetTokens = tokenCount("--budget", values.budget, 0);
      const models = values.models?.split(",").map((m) => m.trim());
      if (models?.some((m) => m === "")) throw new UsageError("--models: a model id must not be empty");
      const created = ledger.createKey({
        budgetTokens,
        ...(values.name === undefined ? {} : { name: values.name }),
        ...(models === undefined ? {} : { models }),
      });
      if (json) {
        io.out(JSON.stringify({ ...created, ...ledger.usage(created.id) }));
      } else {
        io.out(`Created key ${created.id}${values.name === undefined ? "" : ` (${values.name})`}`);
        io.out(`Budget: ${budgetTokens} tokens; models: ${models === undefined ? "all" : models.join(", ")}`);
        io.out("The key is shown only this once; store it now:");
        io.out(created.key);
      }
      return;
    }
    case "list": {
      const keys = ledger.listKeys();
      if (json) io.out(JSON.stringify(keys));
      else printTable(keys, io);
      return;
    }
    case "grant": {
      if (values.tokens === undefined) throw new UsageError("'grant' needs --tokens N");
      const usage = ledger.grant(id, tokenCount("--tokens", values.tokens, 1));
      printUsage(usage, json, io);
      return;
    }
    case "revoke": {
      const summary = ledger.revoke(id);
      if (json) io.out(JSON.stringify(summary));
      else io.out(`Revoked key ${summary.id} at ${new Date(summary.revokedAt ?? 0).toISOString()}`);
      return;
    }
    case "usage":
      printUsage(ledger.usage(id), json, io);
      return;
  }
}

function tokenCount(flag: string, text: string, min: number): number {
  const value = /^[0-9]+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < min) {
    throw new UsageError(`${flag} must be a whole number of tokens ≥ ${min}, got '${text}'`);
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
  io.out(`  budget:     ${usage.budgetTokens}`);
  io.out(`  spent:      ${usage.spentTokens}`);
  io.out(`  held:       ${usage.heldTokens} (${usage.openHolds} open Holds)`);
  io.out(`  available:  ${usage.availableTokens}`);
  io.out(`  requests:   ${usage.settledHolds} settled, ${usage.reclaimedHolds} reclaimed`);
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
      String(k.budgetTokens),
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

process.exitCode = main(process.argv.slice(2), process.env, {
  out: (line) => process.stdout.write(`${line}\n`),
  err: (line) => process.stderr.write(`${line}\n`),
});
