// The admin API's REST JSON (proto/API.md §11): an API key (`object: "api_key"`), an audit log
// entry (`object: "audit_log"`) and OpenAI's list shape, from the acs.v1.AdminService messages.
// Int64s as JSON numbers (every amount and time is a safe integer); unset = null.
import type { ApiKey, AuditLog, RateLimit, RateLimits } from "../../../gen/acs/v1/admin_pb.js";

function renderPair(p: RateLimit | RateLimits): Record<string, number> {
  return {
    ...(p.requestsPerMinute === undefined ? {} : { requests_per_minute: Number(p.requestsPerMinute) }),
    ...(p.tokensPerMinute === undefined ? {} : { tokens_per_minute: Number(p.tokensPerMinute) }),
  };
}

/** `rate_limits` as stored: the set limits only, `models` only when it names one. */
function renderRateLimits(r: RateLimits): Record<string, unknown> {
  const models = Object.entries(r.models);
  return {
    ...renderPair(r),
    ...(models.length === 0
      ? {}
      : { models: Object.fromEntries(models.map(([m, p]) => [m, renderPair(p)])) }),
  };
}

/** An API key as REST shows it; `key` (the secret) only in the answers of create and rotate. */
export function renderApiKey(k: ApiKey | undefined, key?: string): Record<string, unknown> {
  if (k === undefined) throw new Error("the admin service answered without an api_key");
  const metadata = Object.keys(k.metadata).length === 0 ? null : k.metadata;
  return {
    object: "api_key",
    id: k.id,
    name: k.name,
    hint: k.hint,
    budget_tokens: Number(k.budgetTokens),
    spent_tokens: Number(k.spentTokens),
    models: k.models === undefined ? null : k.models.ids,
    rate_limits: k.rateLimits === undefined ? null : renderRateLimits(k.rateLimits),
    expires_at: k.expiresAt === undefined ? null : Number(k.expiresAt),
    metadata,
    created_at: Number(k.createdAt),
    revoked_at: k.revokedAt === undefined ? null : Number(k.revokedAt),
    ...(key === undefined ? {} : { key }),
  };
}

/** An audit log entry as REST shows it. */
export function renderAuditLog(e: AuditLog): Record<string, unknown> {
  return {
    object: "audit_log",
    id: e.id,
    at: Number(e.at),
    actor: e.actor,
    action: e.action,
    target_id: e.targetId,
    before: e.before ?? null,
    after: e.after ?? null,
  };
}

/** OpenAI's list shape. */
export function renderList(
  data: readonly Record<string, unknown>[],
  page: { firstId?: string | undefined; lastId?: string | undefined; hasMore: boolean },
): Record<string, unknown> {
  return {
    object: "list",
    data,
    first_id: page.firstId ?? null,
    last_id: page.lastId ?? null,
    has_more: page.hasMore,
  };
}
