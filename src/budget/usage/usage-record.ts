// One settled request as the `usage_records` table keeps it, and the aggregate a usage query reads
// back (src/budget/README.md, "Usage records").

/**
 * One settled request: what its caller got and what its key was charged. Times are Unix epoch
 * milliseconds; amounts are tokens.
 */
export interface UsageRecord {
  /** The key's public id (`key_` + 12 hex). */
  readonly keyId: string;
  /** The served model's id (an alias the caller named resolved to it). */
  readonly model: string;
  /**
   * Prompt tokens of the answer the caller got: Inference's `usage.prompt_tokens` where it
   * reported one, else the prompt as the Hold counted it; Σ over a fan-out's parts that were sent;
   * 0 when Inference did no work (src/service/usage-meter.ts).
   */
  readonly inputTokens: number;
  /** Tokens generated: Inference's `usage.completion_tokens`, else the token ids counted; Σ over parts. */
  readonly outputTokens: number;
  /**
   * Prompt tokens of a streamed capture's replay — the extra prefill of prompt + generated − 1
   * tokens that gives a stream its activations (proto/API.md §6) — charged as prompt tokens but not
   * in the response's `usage`. 0 for every other request (a non-streamed capture reads its
   * activations from the same pass).
   */
  readonly activationTokens: number;
  /** Tokens the settle charged to the key's Budget (≤ the Hold: src/budget/README.md, settle). */
  readonly chargedTokens: number;
  /**
   * The HTTP status of the outcome: 200 for an answer (a stream that ended normally), the error's
   * status for a refusal or a stream that ended with an error event (whose status line said 200),
   * 499 when the caller went away first (a stream cut short, nginx's "client closed request", as
   * the access log has it).
   */
  readonly status: number;
  /** The request's X-Request-Id. */
  readonly requestId: string;
  /** When the request was settled (its end), Unix epoch ms. */
  readonly createdAt: number;
}

/** What may group a usage query's results (OpenAI's `group_by`, the two this gateway has). */
export type UsageGroupBy = "api_key_id" | "model";

/** One row of a usage aggregate: a bucket's sums for one group. */
export interface UsageAggregateRow {
  /** The bucket's aligned start, Unix epoch ms. */
  readonly bucket: number;
  /** The key id when grouped by `api_key_id`, else null. */
  readonly keyId: string | null;
  /** The model when grouped by `model`, else null. */
  readonly model: string | null;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly requests: number;
}

/** An aggregate over `usage_records` (created_at in [fromMs, toMs), bucketed by widthMs from the epoch). */
export interface UsageAggregateQuery {
  readonly fromMs: number;
  readonly toMs: number;
  /** Bucket width, ms (60,000 / 3,600,000 / 86,400,000: the epoch is aligned to UTC). */
  readonly widthMs: number;
  readonly groupBy: readonly UsageGroupBy[];
  /** Only these keys (undefined: all). */
  readonly apiKeyIds?: readonly string[] | undefined;
  /** Only these models (undefined: all). */
  readonly models?: readonly string[] | undefined;
}
