// GET /v1/admin/usage/completions: OpenAI's Usage API for completions (its query string, its page
// of buckets) over the usage records (src/budget/usage/usage-query.ts), for admin keys: the admin
// service (src/service/admin) checks the key before the query string is read.
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { UsageBucketWidth, UsageCompletionsQuery, UsageGroupBy } from "../../budget/index.js";
import { ApiError } from "../../core/errors/index.js";
import type { ShutdownLink } from "../../core/index.js";
import type { AdminApi } from "../../service/index.js";
import { createCallContext } from "./call-context.js";
import { requestIdOf, sendError } from "./send-error.js";

/** The route's path. */
export const USAGE_COMPLETIONS_PATH = "/v1/admin/usage/completions";

/** What the route needs. */
export interface UsageRouteDeps {
  /** The admin service: it checks the admin key (401, 403), then answers the parsed query. */
  readonly admin: AdminApi;
  readonly shutdown: ShutdownLink;
}

const WIDTHS: ReadonlySet<string> = new Set<UsageBucketWidth>(["1m", "1h", "1d"]);
const GROUPS: ReadonlySet<string> = new Set<UsageGroupBy>(["api_key_id", "model"]);
/** Parameters that take one value. */
const SCALARS = new Set(["start_time", "end_time", "bucket_width", "limit", "page"]);
/** Parameters that take a list: repeated, as `name` or `name[]`. */
const LISTS = new Set(["group_by", "api_key_ids", "models"]);

const invalid = (param: string, message: string) => new ApiError("invalid_request", message, { param });

/** A non-negative integer of at most 15 digits, else 400 naming `param`. */
function integer(param: string, value: string): number {
  if (!/^\d{1,15}$/.test(value))
    throw invalid(param, `Invalid value for '${param}': expected an integer, got '${value}'.`);
  return Number(value);
}

/** The raw query string's parameters: scalars once each, lists gathered; 400 for anything else. */
function readParams(url: string): { scalars: Map<string, string>; lists: Map<string, string[]> } {
  const at = url.indexOf("?");
  const scalars = new Map<string, string>();
  const lists = new Map<string, string[]>();
  for (const [rawName, value] of new URLSearchParams(at === -1 ? "" : url.slice(at + 1))) {
    const name = rawName.endsWith("[]") ? rawName.slice(0, -2) : rawName;
    if (LISTS.has(name)) {
      lists.set(name, [...(lists.get(name) ?? []), value]);
    } else if (SCALARS.has(name) && name === rawName) {
      if (scalars.has(name)) throw invalid(name, `'${name}' is given more than once.`);
      scalars.set(name, value);
    } else {
      throw invalid(rawName, `Unrecognized request argument supplied: ${rawName}`);
    }
  }
  return { scalars, lists };
}

/**
 * The query of a request's query string, strictly: OpenAI's names (`start_time` required, Unix
 * seconds; `end_time`; `bucket_width` 1m / 1h / 1d; `group_by`, `api_key_ids`, `models` repeated;
 * `limit`; `page`), each scalar once, no other parameter. Throws ApiError 400 `invalid_request`
 * whose param names the parameter.
 */
export function parseUsageQuery(url: string): UsageCompletionsQuery {
  const { scalars, lists } = readParams(url);
  const start = scalars.get("start_time");
  if (start === undefined) throw invalid("start_time", "Missing required parameter: 'start_time'.");
  const width = scalars.get("bucket_width");
  if (width !== undefined && !WIDTHS.has(width)) {
    throw invalid(
      "bucket_width",
      `Invalid value for 'bucket_width': expected one of 1m, 1h, 1d, got '${width}'.`,
    );
  }
  const groupBy = lists.get("group_by");
  for (const g of groupBy ?? []) {
    if (!GROUPS.has(g))
      throw invalid("group_by", `Invalid value for 'group_by': expected api_key_id or model, got '${g}'.`);
  }
  const end = scalars.get("end_time");
  const limit = scalars.get("limit");
  return {
    startTime: integer("start_time", start),
    endTime: end === undefined ? undefined : integer("end_time", end),
    bucketWidth: width as UsageBucketWidth | undefined,
    groupBy: groupBy === undefined ? undefined : ([...new Set(groupBy)] as UsageGroupBy[]),
    apiKeyIds: lists.get("api_key_ids"),
    models: lists.get("models"),
    limit: limit === undefined ? undefined : integer("limit", limit),
    page: scalars.get("page"),
  };
}

/** The route's handler: authorize, parse, answer the page (or the envelope of proto/API.md §7). */
async function getUsage(
  deps: UsageRouteDeps,
  request: FastifyRequest,
  reply: FastifyReply,
): Promise<FastifyReply> {
  try {
    const ctx = createCallContext(request, reply, deps.shutdown);
    const url = request.raw.url ?? request.url;
    const page = await deps.admin.usageCompletions(() => parseUsageQuery(url), ctx);
    requestIdOf(reply);
    return reply.type("application/json; charset=utf-8").send(JSON.stringify(page));
  } catch (err) {
    return sendError(reply, err, requestIdOf(reply));
  }
}

/** Registers `GET /v1/admin/usage/completions` on `app` (beside the admin routes: rest-routes.ts). */
export function registerUsageRoute(app: FastifyInstance, deps: UsageRouteDeps): void {
  app.get(USAGE_COMPLETIONS_PATH, (request, reply) => getUsage(deps, request, reply));
}
