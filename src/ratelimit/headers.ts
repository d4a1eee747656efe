// OpenAI's rate-limit response headers of a decision: x-ratelimit-limit-requests,
// x-ratelimit-remaining-requests, x-ratelimit-reset-requests and the -tokens trio, only for the
// dimensions that are limited. A reset is written as OpenAI writes it, Go's time.Duration text
// (`1s`, `6m0s`, `20ms`, `1m30.5s`, `0s`).
import type { RateDecision, WindowState } from "./rate-limit-store.js";

/** `ms` (rounded up to a whole ms) in Go's duration text, as OpenAI's x-ratelimit-reset-* are. */
export function formatResetDuration(ms: number): string {
  const total = Math.max(0, Math.ceil(ms));
  if (total === 0) return "0s";
  if (total < 1000) return `${total}ms`;
  const hours = Math.floor(total / 3_600_000);
  const minutes = Math.floor((total % 3_600_000) / 60_000);
  const millis = total % 60_000;
  const seconds = `${Math.floor(millis / 1000)}${millis % 1000 ? `.${String(millis % 1000).padStart(3, "0")}`.replace(/0+$/, "") : ""}s`;
  if (hours > 0) return `${hours}h${minutes}m${seconds}`;
  if (minutes > 0) return `${minutes}m${seconds}`;
  return seconds;
}

function trio(
  out: Record<string, string>,
  dimension: "requests" | "tokens",
  state: WindowState | undefined,
): void {
  if (state === undefined) return;
  out[`x-ratelimit-limit-${dimension}`] = String(state.limit);
  out[`x-ratelimit-remaining-${dimension}`] = String(state.remaining);
  out[`x-ratelimit-reset-${dimension}`] = formatResetDuration(state.resetMs);
}

/** The headers of `decision`, lower-case names; {} when neither dimension is limited. */
export function rateLimitHeaders(decision: RateDecision): Record<string, string> {
  const out: Record<string, string> = {};
  trio(out, "requests", decision.requests);
  trio(out, "tokens", decision.tokens);
  return out;
}
