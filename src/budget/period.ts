// Budget periods (proto/API.md §9, src/budget/README.md "Budget periods"): where a key's period
// starts and ends, at UTC calendar boundaries. Pure: every function takes the time it works on.

/** How often a key's `spent` starts again from 0: never, each UTC day, ISO week (Monday) or month. */
export type BudgetPeriod = "none" | "day" | "week" | "month";

/** Every period, in the order the CLI and the docs list them. */
export const BUDGET_PERIODS: readonly BudgetPeriod[] = ["none", "day", "week", "month"];

const DAY_MS = 86_400_000;

/** True for one of {@link BUDGET_PERIODS}. */
export function isBudgetPeriod(value: unknown): value is BudgetPeriod {
  return typeof value === "string" && (BUDGET_PERIODS as readonly string[]).includes(value);
}

/**
 * The start (Unix epoch ms, UTC) of the period of `period` that contains `nowMs`: 00:00 UTC of its
 * day, of the Monday of its ISO week, or of the 1st of its month; 0 for `none` (one period that
 * never ends).
 */
export function periodStart(period: BudgetPeriod, nowMs: number): number {
  if (period === "none") return 0;
  const day = Math.floor(nowMs / DAY_MS) * DAY_MS;
  if (period === "day") return day;
  if (period === "week") {
    // getUTCDay: 0 = Sunday … 6 = Saturday; days since Monday = (d + 6) % 7.
    return day - ((new Date(day).getUTCDay() + 6) % 7) * DAY_MS;
  }
  const d = new Date(day);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
}

/**
 * The start of the period after the one that starts at `startMs` (itself a {@link periodStart}):
 * the next day, Monday or 1st at 00:00 UTC; 0 for `none` (never).
 */
export function nextBoundary(period: BudgetPeriod, startMs: number): number {
  if (period === "none") return 0;
  if (period === "day") return startMs + DAY_MS;
  if (period === "week") return startMs + 7 * DAY_MS;
  const d = new Date(startMs);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}
