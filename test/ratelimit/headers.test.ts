// OpenAI's x-ratelimit-* headers of a decision (src/ratelimit/headers.ts): the reset in Go's
// duration text as OpenAI writes it, only the limited dimensions.
import { describe, expect, it } from "vitest";
import { formatResetDuration, rateLimitHeaders } from "../../src/ratelimit/headers.js";

describe("formatResetDuration", () => {
  it.each([
    [0, "0s"],
    [-5, "0s"],
    [0.2, "1ms"],
    [1, "1ms"],
    [20, "20ms"],
    [999, "999ms"],
    [1000, "1s"],
    [1001, "1.001s"],
    [1500, "1.5s"],
    [12_340, "12.34s"],
    [59_999, "59.999s"],
    [60_000, "1m0s"],
    [90_500, "1m30.5s"],
    [360_000, "6m0s"],
    [3_600_000, "1h0m0s"],
    [3_723_004, "1h2m3.004s"],
  ])("%d ms is %s", (ms, text) => {
    expect(formatResetDuration(ms)).toBe(text);
  });
});

describe("rateLimitHeaders", () => {
  it("writes the trio of each limited dimension, and nothing of the others", () => {
    const both = {
      admitted: true,
      retryAfterMs: 0,
      requests: { limit: 60, remaining: 59, resetMs: 1000 },
      tokens: { limit: 150_000, remaining: 149_984, resetMs: 360_000 },
    };
    expect(rateLimitHeaders(both)).toEqual({
      "x-ratelimit-limit-requests": "60",
      "x-ratelimit-remaining-requests": "59",
      "x-ratelimit-reset-requests": "1s",
      "x-ratelimit-limit-tokens": "150000",
      "x-ratelimit-remaining-tokens": "149984",
      "x-ratelimit-reset-tokens": "6m0s",
    });
    expect(rateLimitHeaders({ ...both, requests: undefined })).toEqual({
      "x-ratelimit-limit-tokens": "150000",
      "x-ratelimit-remaining-tokens": "149984",
      "x-ratelimit-reset-tokens": "6m0s",
    });
    expect(rateLimitHeaders({ ...both, requests: undefined, tokens: undefined })).toEqual({});
  });
});
