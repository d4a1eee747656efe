// OpenAI's Usage API for completions over the usage records: `GET /v1/organization/usage/completions`
// as this gateway answers it at `/v1/admin/usage/completions` (src/budget/README.md, "Usage records").
import { ApiError } from "../../core/errors/index.js";
import type { BudgetStore } from "../budget-store.js";
import type { UsageAggregateRow, UsageGroupBy } from "./usage-record.js";

/** OpenAI's bucket widths. */
export type UsageBucketWidth = "1m" | "1h" | "1d";

/** Each width: its length (s) and OpenAI's default and largest `limit` (buckets per page). */
export const USAGE_BUCKET_WIDTHS: Readonly<
  Record<
    UsageBucketWidth,
    { readonly seconds: number; readonly defaultLimit: number; readonly maxLimit: number }
  >
> = {
  "1m": { seconds: 60, defaultLimit: 60, maxLimit: 1440 },
  "1h": { seconds: 3600, defaultLimit: 24, maxLimit: 168 },
  "1d": { seconds: 86_400, defaultLimit: 7, maxLimit: 31 },
};

/** Most ids in `api_key_ids` or `models` (each one SQL parameter). */
export const MAX_USAGE_FILTER_VALUES = 100;

/** The query, as OpenAI names it (times in Unix seconds). */
export interface UsageCompletionsQuery {
  /** Start of the range, inclusive, Unix seconds. */
  readonly startTime: number;
  /** End of the range, exclusive, Unix seconds. @default now */
  readonly endTime?: number | undefined;
  /** @default "1d" */
  readonly bucketWidth?: UsageBucketWidth | undefined;
  /** @default [] (one result per bucket, over everything) */
  readonly groupBy?: readonly UsageGroupBy[] | undefined;
  readonly apiKeyIds?: readonly string[] | undefined;
  readonly models?: readonly string[] | undefined;
  /** Buckets per page. @default per width: 60 (1m), 24 (1h), 7 (1d); at most 1440, 168, 31 */
  readonly limit?: number | undefined;
  /** The `next_page` of the previous page. */
  readonly page?: string | undefined;
}

/** One result of a bucket: OpenAI's `organization.usage.completions.result`. */
export interface UsageCompletionsResult {
  readonly object: "organization.usage.completions.result";
  readonly input_tokens: number;
  readonly output_tokens: number;
  readonly input_cached_tokens: number;
  readonly input_audio_tokens: number;
  readonly output_audio_tokens: number;
  readonly num_model_requests: number;
  readonly project_id: null;
  readonly user_id: null;
  /** The key's id when grouped by `api_key_id`, else null. */
  readonly api_key_id: string | null;
  /** The served model's id when grouped by `model`, else null. */
  readonly model: string | null;
  readonly batch: null;
  readonly service_tier: null;
}

/** A bucket: [start_time, end_time) in Unix seconds, its results (empty when nothing was settled in it). */
export interface UsageBucket {
  readonly object: "bucket";
  readonly start_time: number;
  readonly end_time: number;
  readonly results: UsageCompletionsResult[];
}

/** A page of buckets, OpenAI's shape. */
export interface UsageCompletionsPage {
  readonly object: "page";
  readonly data: UsageBucket[];
  readonly has_more: boolean;
  readonly next_page: string | null;
}

const invalid = (param: string, message: string) => new ApiError("invalid_request", message, { param });

/** `page_` + base64url of the page's first aligned bucket start (Unix seconds). */
const cursorOf = (startSeconds: number): string =>
  `page_${Buffer.from(String(startSeconds)).toString("base64url")}`;

/** The aligned bucket start a cursor names; throws 400 (param `page`) for one this query did not make. */
function pageStart(page: string, first: number, end: number, width: number): number {
  const raw = page.startsWith("page_") ? Buffer.from(page.slice(5), "base64url").toString() : "";
  const at = /^\d{1,15}$/.test(raw) ? Number(raw) : Number.NaN;
  if (!(at >= first && at < end && (at - first) % width === 0)) {
    throw invalid("page", `Invalid page cursor '${page}': pass the next_page of the previous response.`);
  }
  return at;
}

/** The query's numbers resolved (defaults filled in) and checked; throws 400 with the parameter. */
function resolve(q: UsageCompletionsQuery, nowSeconds: number) {
  const widthName = q.bucketWidth ?? "1d";
  const width = USAGE_BUCKET_WIDTHS[widthName];
  if (width === undefined) throw invalid("bucket_width", "bucket_width must be one of 1m, 1h, 1d.");
  const end = q.endTime ?? nowSeconds;
  if (!Number.isSafeInteger(q.startTime) || q.startTime < 0) {
    throw invalid("start_time", "start_time must be a non-negative integer (Unix seconds).");
  }
  if (!Number.isSafeInteger(end) || end <= q.startTime) {
    throw invalid("end_time", "end_time must be an integer (Unix seconds) after start_time.");
  }
  const limit = q.limit ?? width.defaultLimit;
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > width.maxLimit) {
    throw invalid(
      "limit",
      `limit must be an integer from 1 to ${width.maxLimit} with bucket_width=${widthName}.`,
    );
  }
  for (const [param, list] of [
    ["api_key_ids", q.apiKeyIds],
    ["models", q.models],
  ] as const) {
    if (list !== undefined && list.length > MAX_USAGE_FILTER_VALUES) {
      throw invalid(param, `${param} takes at most ${MAX_USAGE_FILTER_VALUES} values.`);
    }
  }
  const w = width.seconds;
  const first = Math.floor(q.startTime / w) * w;
  const from = q.page === undefined ? first : pageStart(q.page, first, end, w);
  return { start: q.startTime, end, w, from, to: Math.min(end, from + limit * w) };
}

/** OpenAI's result of one aggregate row. */
function resultOf(row: UsageAggregateRow): UsageCompletionsResult {
  return {
    object: "organization.usage.completions.result",
    input_tokens: row.inputTokens,
    output_tokens: row.outputTokens,
    input_cached_tokens: 0,
    input_audio_tokens: 0,
    output_audio_tokens: 0,
    num_model_requests: row.requests,
    project_id: null,
    user_id: null,
    api_key_id: row.keyId,
    model: row.model,
    batch: null,
    service_tier: null,
  };
}

/**
 * One page of completions usage, OpenAI's shape: buckets aligned to UTC (the epoch is), each
 * [max(start_time, its start), min(end_time, its end)) — the first starts at start_time, the last
 * ends at end_time — every bucket of the page present, empty ones with `results: []`, `limit`
 * buckets a page, `next_page` a cursor to the next. Times in Unix seconds; a record counts in the
 * bucket of its `created_at` (when the request settled). Sums in SQL ({@link BudgetStore.usageAggregate}).
 * Throws ApiError 400 `invalid_request` with the parameter for a value out of range.
 */
export async function usageCompletions(
  store: BudgetStore,
  query: UsageCompletionsQuery,
  nowMs: number = Date.now(),
): Promise<UsageCompletionsPage> {
  const r = resolve(query, Math.floor(nowMs / 1000));
  const rows = await store.usageAggregate({
    fromMs: Math.max(r.start, r.from) * 1000,
    toMs: r.to * 1000,
    widthMs: r.w * 1000,
    groupBy: query.groupBy ?? [],
    apiKeyIds: query.apiKeyIds,
    models: query.models,
  });
  const byBucket = new Map<number, UsageCompletionsResult[]>();
  for (const row of rows) {
    const at = row.bucket / 1000;
    const list = byBucket.get(at) ?? [];
    list.push(resultOf(row));
    byBucket.set(at, list);
  }
  const data: UsageBucket[] = [];
  for (let at = r.from; at < r.to; at += r.w) {
    const start_time = Math.max(at, r.start);
    data.push({
      object: "bucket",
      start_time,
      end_time: Math.min(at + r.w, r.end),
      results: byBucket.get(at) ?? [],
    });
  }
  const hasMore = r.to < r.end;
  return { object: "page", data, has_more: hasMore, next_page: hasMore ? cursorOf(r.to) : null };
}
