// How the keys CLI (src/budget/cli.ts) prints: a key's usage, the key table, a key's settings, the
// audit log; `--json` prints the objects themselves.
import type { AuditEntry } from "./admin-store.js";
import type { KeySummary, KeyUsage } from "./ledger/api.js";

export interface Io {
  out(line: string): void;
  err(line: string): void;
}

/** Columns padded to their widest cell (`right`: right-aligned but the first). */
function table(rows: readonly string[][], io: Io, indent = "", right = false): void {
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  const pad = (cell: string, i: number) =>
    right && i > 0 ? cell.padStart(widths[i] ?? 0) : cell.padEnd(widths[i] ?? 0);
  for (const row of rows) io.out(`${indent}${row.map(pad).join("  ")}`.trimEnd());
}

/** A key's rate limits, expiry and metadata, one line each that is set. */
export function printSettings(k: KeySummary, io: Io): void {
  const r = k.rateLimits;
  if (r !== null) {
    const parts = [
      ...(r.requestsPerMinute === undefined ? [] : [`${r.requestsPerMinute} requests/min`]),
      ...(r.tokensPerMinute === undefined ? [] : [`${r.tokensPerMinute} tokens/min`]),
      ...Object.entries(r.models ?? {}).map(
        ([m, p]) =>
          `${m}: ${p.requestsPerMinute ?? "-"} requests/min, ${p.tokensPerMinute ?? "-"} tokens/min`,
      ),
    ];
    io.out(`  limits:     ${parts.join("; ")}`);
  }
  if (k.expiresAt !== null) io.out(`  expires:    ${new Date(k.expiresAt).toISOString()}`);
  if (k.metadata !== null) {
    io.out(
      `  metadata:   ${Object.entries(k.metadata)
        .map(([m, v]) => `${m}=${v}`)
        .join(", ")}`,
    );
  }
}

export function printUsage(usage: KeyUsage, json: boolean, io: Io): void {
  if (json) {
    io.out(JSON.stringify(usage));
    return;
  }
  io.out(`Key ${usage.id}${usage.name === "" ? "" : ` (${usage.name})`} ${usage.hint}`);
  io.out(
    `  state:      ${usage.revokedAt === null ? "live" : `revoked ${new Date(usage.revokedAt).toISOString()}`}`,
  );
  io.out(`  models:     ${usage.models === null ? "all" : usage.models.join(", ")}`);
  printSettings(usage, io);
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
  table(rows, io, "    ", true);
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

export function printTable(keys: readonly KeySummary[], io: Io): void {
  if (keys.length === 0) {
    io.out("No keys.");
    return;
  }
  const state = (k: KeySummary) =>
    k.revokedAt !== null ? "revoked" : k.expiresAt !== null && k.expiresAt <= Date.now() ? "expired" : "live";
  table(
    [
      ["ID", "NAME", "KEY", "BUDGET", "SPENT", "STATE", "MODELS", "CREATED"],
      ...keys.map((k) => [
        k.id,
        k.name,
        k.hint,
        `${k.budgetTokens}${k.period === undefined ? "" : `/${k.period}`}`,
        String(k.spentTokens),
        state(k),
        k.models === null ? "all" : k.models.join(","),
        new Date(k.createdAt).toISOString(),
      ]),
    ],
    io,
  );
}

export function printAudit(entries: readonly AuditEntry[], io: Io): void {
  if (entries.length === 0) {
    io.out("No audit log entries.");
    return;
  }
  table(
    [
      ["AT", "ACTOR", "ACTION", "TARGET", "ID"],
      ...entries.map((e) => [new Date(e.at).toISOString(), e.actor, e.action, e.targetId, e.id]),
    ],
    io,
  );
}
