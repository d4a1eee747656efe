// Budget periods in the shared transactions: the rollover of a key row into its current period,
// and the counters (spent, held, leased of one period) that a Hold or a lease of a given period
// moves — the key row's for the current period, a `budget_periods` row's for a past one.
// src/budget/README.md, "Budget periods".
import { nextBoundary, periodStart } from "../period.js";
import type { TxRows } from "./backend.js";
import type { KeyRow } from "./rows.js";

/** One period's numbers, as a transaction reads them and writes them back. Amounts are tokens. */
export interface Counters {
  /** True for the key's current period (the key row); false for a past period's row. */
  readonly current: boolean;
  readonly budget: number;
  readonly spent: number;
  readonly held: number;
  readonly leased: number;
  /** Writes the period's new numbers (spent + held + leased ≤ budget: a CHECK in both stores). */
  write(spent: number, held: number, leased: number): void;
}

/** A period's free tokens: budget − spent − held − leased. */
export const freeIn = (c: Counters): number => c.budget - c.spent - c.held - c.leased;

/**
 * The key row rolled over to the period that contains `now`, the first thing every transaction
 * that locks a key row does: when the key has a period and `now` is at or past its end, the
 * current numbers go to a `budget_periods` row of the period that ended (what it charged, and what
 * of it is still held or leased: those Holds and leases settle to it), and the key row starts the
 * period of `now` at spent = held = leased = 0. Returns the key as it is after that. A key idle
 * over several periods gets one row, of the last period it was used in (the others charged nothing).
 */
export function rollover(rows: TxRows, key: KeyRow, now: number): KeyRow {
  if (key.periodEnd === 0 || now < key.periodEnd) return key;
  rows.writePeriod({
    keyId: key.id,
    periodStart: key.periodStart,
    periodEnd: key.periodEnd,
    budgetTokens: key.budgetTokens,
    spentTokens: key.spentTokens,
    heldTokens: key.heldTokens,
    leasedTokens: key.leasedTokens,
  });
  const start = periodStart(key.period, now);
  const end = nextBoundary(key.period, start);
  rows.rollKey(key.id, start, end);
  return { ...key, spentTokens: 0, heldTokens: 0, leasedTokens: 0, periodStart: start, periodEnd: end };
}

/** The counters of the key row: its current period's. */
function keyCounters(rows: TxRows, key: KeyRow): Counters {
  return {
    current: true,
    budget: key.budgetTokens,
    spent: key.spentTokens,
    held: key.heldTokens,
    leased: key.leasedTokens,
    write: (spent, held, leased) => rows.setKeyNumbers(key.id, spent, held, leased),
  };
}

/**
 * The counters of the period that starts at `start` (a Hold's or a lease's periodStart), the key
 * already rolled over ({@link rollover}): the key row's when it is the current period, else the
 * past period's row, locked. A past period without a row (none is ever deleted, so only a store
 * edited by hand) has counters that hold nothing and write nothing: its Holds are closed, charged
 * to no period.
 */
export async function countersOf(rows: TxRows, key: KeyRow, start: number): Promise<Counters> {
  if (start === key.periodStart) return keyCounters(rows, key);
  const row = await rows.lockPeriod(key.id, start);
  if (row === undefined) {
    return { current: false, budget: 0, spent: 0, held: 0, leased: 0, write: () => undefined };
  }
  return {
    current: false,
    budget: row.budgetTokens,
    spent: row.spentTokens,
    held: row.heldTokens,
    leased: row.leasedTokens,
    write: (spent, held, leased) =>
      rows.writePeriod({ ...row, spentTokens: spent, heldTokens: held, leasedTokens: leased }),
  };
}
