// The usage records' statements, written once for both backends over their placeholders: the
// multi-row INSERT of a flush and the bucketed aggregate of a usage query (GROUP BY in SQL).
import type { UsageAggregateQuery, UsageAggregateRow, UsageRecord } from "../usage/usage-record.js";
import type { StoreBackend } from "./backend.js";

/** Most rows in one INSERT (10 values each: well under SQLite's 32,766 and PostgreSQL's 65,535 parameters). */
export const MAX_USAGE_ROWS_PER_INSERT = 500;

const COLUMNS =
  "key_id, model, input_tokens, output_tokens, activation_tokens, charged_tokens, status, request_id, created_at";
const PER_ROW = 9;

/** The values of one record, in {@link COLUMNS} order. */
function valuesOf(r: UsageRecord): unknown[] {
  return [
    r.keyId,
    r.model,
    r.inputTokens,
    r.outputTokens,
    r.activationTokens,
    r.chargedTokens,
    r.status,
    r.requestId,
    r.createdAt,
  ];
}

/**
 * Writes `records` with one multi-row INSERT per {@link MAX_USAGE_ROWS_PER_INSERT} rows (one for a
 * flush of the usual size); nothing for none.
 */
export async function insertUsageOn(backend: StoreBackend, records: readonly UsageRecord[]): Promise<void> {
  for (let start = 0; start < records.length; start += MAX_USAGE_ROWS_PER_INSERT) {
    const chunk = records.slice(start, start + MAX_USAGE_ROWS_PER_INSERT);
    const p = backend.placeholder;
    const tuples = chunk.map(
      (_, i) => `(${Array.from({ length: PER_ROW }, (_, j) => p(i * PER_ROW + j + 1)).join(", ")})`,
    );
    await backend.write(
      `INSERT INTO usage_records (${COLUMNS}) VALUES ${tuples.join(", ")}`,
      chunk.flatMap(valuesOf),
    );
  }
}

/** The SQL row of the aggregate. */
interface AggregateSqlRow {
  bucket: number;
  key_id: string | null;
  model: string | null;
  input_tokens: number;
  output_tokens: number;
  requests: number;
}

/**
 * The sums of `usage_records` per bucket (`created_at / width * width`: integer division on both
 * stores) and per group, in bucket, key id, model order. Filters and grouping columns come from
 * closed lists, so the SQL holds no caller text; values are parameters.
 */
export async function usageAggregateOn(
  backend: StoreBackend,
  q: UsageAggregateQuery,
): Promise<UsageAggregateRow[]> {
  const values: unknown[] = [];
  const param = (v: unknown): string => {
    values.push(v);
    return backend.placeholder(values.length);
  };
  const width = param(q.widthMs);
  const bucket = `(created_at / CAST(${width} AS BIGINT)) * CAST(${param(q.widthMs)} AS BIGINT)`;
  const where = [`created_at >= ${param(q.fromMs)}`, `created_at < ${param(q.toMs)}`];
  const inList = (column: string, list: readonly string[] | undefined) => {
    if (list !== undefined) where.push(`${column} IN (${list.map((v) => param(v)).join(", ")})`);
  };
  inList("key_id", q.apiKeyIds);
  inList("model", q.models);
  const byKey = q.groupBy.includes("api_key_id");
  const byModel = q.groupBy.includes("model");
  const groups = ["bucket", ...(byKey ? ["key_id"] : []), ...(byModel ? ["model"] : [])];
  const sql = `SELECT ${bucket} AS bucket,
      ${byKey ? "key_id" : "NULL"} AS key_id, ${byModel ? "model" : "NULL"} AS model,
      CAST(sum(input_tokens) AS BIGINT) AS input_tokens, CAST(sum(output_tokens) AS BIGINT) AS output_tokens,
      CAST(count(*) AS BIGINT) AS requests
    FROM usage_records WHERE ${where.join(" AND ")}
    GROUP BY ${groups.join(", ")} ORDER BY ${groups.join(", ")}`;
  const rows = await backend.read<AggregateSqlRow>(sql, values);
  return rows.map((r) => ({
    bucket: Number(r.bucket),
    keyId: r.key_id,
    model: r.model,
    inputTokens: Number(r.input_tokens),
    outputTokens: Number(r.output_tokens),
    requests: Number(r.requests),
  }));
}
