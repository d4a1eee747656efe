/**
 * `npm run keys -- <command>` (compiled: dist/src/budget/cli.js; `npm run keys:dev` runs this
 * file with tsx): administers keys and Budgets in the gateway's database: a SQLite
 * file or PostgreSQL (ACS_DB=postgres://…). The only place under src/budget that reads
 * process.env (ACS_DB). Exit codes: 0 done, 1 the command failed (e.g. unknown key id), 2 wrong
 * usage or a database that cannot be opened (one line, as the gateway's start-up says it).
 */
import { checkDbPath } from "../config/check-db-path.js";
import { ConfigError } from "../config/config-error.js";
import { dbOpenError, redactDb } from "../config/db-open-error.js";
import { type Command, HELP, parse, type SettingArgs, toCommand, type Values } from "./cli-args.js";
import { type Io, printAudit, printSettings, printTable, printUsage } from "./cli-print.js";
import {
  type BudgetLedger,
  createBudgetLedger,
  isPostgresUrl,
  KeySettingError,
  type KeySettings,
  type KeySummary,
  type RateLimits,
  UnknownIdError,
} from "./index.js";

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
    io.err(
      `error: ${err instanceof UnknownIdError || err instanceof KeySettingError ? err.message : String(err)}`,
    );
    return 1;
  } finally {
    await ledger.close();
  }
}

/** The settings of create or update out of the command line's; `current`: the key's limits (update). */
function settingsOf(args: SettingArgs, current: RateLimits | null): KeySettings {
  let rateLimits: RateLimits | null | undefined;
  if (args.rpm !== undefined || args.tpm !== undefined) {
    const { requestsPerMinute, tokensPerMinute, ...models } = current ?? {};
    const rpm = args.rpm === undefined ? requestsPerMinute : (args.rpm ?? undefined);
    const tpm = args.tpm === undefined ? tokensPerMinute : (args.tpm ?? undefined);
    rateLimits = {
      ...models,
      ...(rpm === undefined ? {} : { requestsPerMinute: rpm }),
      ...(tpm === undefined ? {} : { tokensPerMinute: tpm }),
    };
    if (Object.keys(rateLimits).length === 0) rateLimits = null;
  }
  return {
    ...(rateLimits === undefined ? {} : { rateLimits }),
    ...(args.expiresAt === undefined ? {} : { expiresAt: args.expiresAt }),
    ...(args.metadata === undefined ? {} : { metadata: args.metadata }),
  };
}

/** A created or changed key: its JSON, or its lines (and its secret, once, when it has one). */
function printKey(what: string, k: KeySummary & { key?: string }, io: Io, json: boolean): void {
  if (json) {
    io.out(JSON.stringify(k));
    return;
  }
  io.out(`${what} key ${k.id}${k.name === "" ? "" : ` (${k.name})`}`);
  const per = k.period === undefined ? "" : ` a ${k.period} (UTC)`;
  io.out(
    `Budget: ${k.budgetTokens} tokens${per}; models: ${k.models === null ? "all" : k.models.join(", ")}`,
  );
  printSettings(k, io);
  if (k.key === undefined) return;
  io.out("The key is shown only this once; store it now:");
  io.out(k.key);
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
        ...settingsOf(command, null),
      });
      if (json) io.out(JSON.stringify({ ...created, ...(await ledger.usage(created.id)) }));
      else printKey("Created", created, io, false);
      return;
    }
    case "update": {
      const { id, name, budgetTokens, models } = command;
      const needsLimits = command.rpm !== undefined || command.tpm !== undefined;
      const current = needsLimits ? (await ledger.getKey(id)).rateLimits : null;
      const changed = await ledger.updateKey(id, {
        ...(name === undefined ? {} : { name }),
        ...(budgetTokens === undefined ? {} : { budgetTokens }),
        ...(models === undefined ? {} : { models }),
        ...settingsOf(command, current),
      });
      printKey("Updated", changed, io, json);
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
    case "rotate":
      printKey("Rotated", await ledger.rotateKey(command.id), io, json);
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
    default:
      await runAdmin(ledger, command, json, io);
  }
}

/** The commands on admin keys and the audit log. */
async function runAdmin(ledger: BudgetLedger, command: Command, json: boolean, io: Io): Promise<void> {
  switch (command.kind) {
    case "create-admin": {
      const created = await ledger.createAdminKey(command.name === undefined ? {} : { name: command.name });
      if (json) {
        io.out(JSON.stringify(created));
        return;
      }
      io.out(`Created admin key ${created.id}${created.name === "" ? "" : ` (${created.name})`}`);
      io.out("The admin key is shown only this once; store it now:");
      io.out(created.key);
      return;
    }
    case "revoke-admin": {
      const revoked = await ledger.revokeAdminKey(command.id);
      if (json) io.out(JSON.stringify(revoked));
      else io.out(`Revoked admin key ${revoked.id} at ${new Date(revoked.revokedAt ?? 0).toISOString()}`);
      return;
    }
    case "audit": {
      const page = await ledger.listAuditLogs({ limit: command.limit });
      if (json) io.out(JSON.stringify(page.items));
      else printAudit(page.items, io);
      return;
    }
  }
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
