// The UTC day of a time, as the daily usage of keys is kept (one row per key and day).
const DAY_MS = 86_400_000;
/** The last day utcDay formatted: [start, end) in Unix epoch ms, and its text. */
let lastDay = { start: 0, end: 0, text: "" };

/** `YYYY-MM-DD` (UTC) of a Unix epoch ms (the last day's text is reused: one Date per day, not per call). */
export function utcDay(ms: number): string {
  if (ms >= lastDay.start && ms < lastDay.end) return lastDay.text;
  const text = new Date(ms).toISOString().slice(0, 10);
  if (Number.isSafeInteger(ms)) {
    const start = ms - (((ms % DAY_MS) + DAY_MS) % DAY_MS);
    lastDay = { start, end: start + DAY_MS, text };
  }
  return text;
}
