// The admin service's messages (proto/acs/v1/admin.proto) to and from the ledger's shapes: a key,
// its settings and rate limits, an audit row. Int64 fields arrive as bigint: each is read as a
// safe integer ≥ its minimum or refused (400, param as REST names the field).

import type { JsonObject } from "@bufbuild/protobuf";
import { create } from "@bufbuild/protobuf";
import {
  type ApiKey,
  ApiKeySchema,
  type AuditLog,
  AuditLogSchema,
  type KeySettings as KeySettingsMessage,
  ModelListSchema,
  type RateLimit,
  RateLimitSchema,
  type RateLimits as RateLimitsMessage,
  RateLimitsSchema,
} from "../../../gen/acs/v1/admin_pb.js";
import type { AuditEntry, KeySettings, KeySummary, RateLimitPair, RateLimits } from "../../budget/index.js";
import { invalidRequest } from "../../core/errors/index.js";

/** A safe integer ≥ min of an int64 field; 400 `invalid_request` (param) otherwise. */
export function safeInt(value: bigint, param: string, min: number): number {
  if (value < BigInt(min) || value > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw invalidRequest(
      param,
      `Invalid value for '${param}': expected an integer from ${min} to 2^53 − 1, got ${value}.`,
    );
  }
  return Number(value);
}

function pairOf(
  p: { requestsPerMinute?: bigint | undefined; tokensPerMinute?: bigint | undefined },
  param: string,
): RateLimitPair {
  return {
    ...(p.requestsPerMinute === undefined
      ? {}
      : { requestsPerMinute: safeInt(p.requestsPerMinute, `${param}.requests_per_minute`, 1) }),
    ...(p.tokensPerMinute === undefined
      ? {}
      : { tokensPerMinute: safeInt(p.tokensPerMinute, `${param}.tokens_per_minute`, 1) }),
  };
}

/** The ledger's rate limits of the message (param `rate_limits`). */
export function rateLimitsOf(m: RateLimitsMessage): RateLimits {
  const models = Object.entries(m.models).map(([model, p]) => [
    model,
    pairOf(p, `rate_limits.models.${model}`),
  ]);
  return {
    ...pairOf(m, "rate_limits"),
    ...(models.length === 0 ? {} : { models: Object.fromEntries(models) }),
  };
}

/** The settings of a message, those `paths` name (all of them when undefined); empty metadata is none. */
export function settingsOf(
  s: KeySettingsMessage,
  paths?: ReadonlySet<string>,
): KeySettings & { name?: string; budgetTokens?: number } {
  const has = (p: string) => paths === undefined || paths.has(p);
  const metadata = Object.keys(s.metadata).length === 0 ? null : { ...s.metadata };
  return {
    ...(has("name") ? { name: s.name } : {}),
    ...(has("budget_tokens") ? { budgetTokens: safeInt(s.budgetTokens, "budget_tokens", 0) } : {}),
    ...(has("models") ? { models: s.models === undefined ? null : s.models.ids } : {}),
    ...(has("rate_limits")
      ? { rateLimits: s.rateLimits === undefined ? null : rateLimitsOf(s.rateLimits) }
      : {}),
    ...(has("expires_at")
      ? { expiresAt: s.expiresAt === undefined ? null : safeInt(s.expiresAt, "expires_at", 0) }
      : {}),
    ...(has("metadata") ? { metadata } : {}),
  };
}

function pairMessage(p: RateLimitPair): Omit<RateLimit, "$typeName"> {
  return {
    ...(p.requestsPerMinute === undefined ? {} : { requestsPerMinute: BigInt(p.requestsPerMinute) }),
    ...(p.tokensPerMinute === undefined ? {} : { tokensPerMinute: BigInt(p.tokensPerMinute) }),
  };
}

/** The ApiKey message of a key. */
export function apiKeyOf(k: KeySummary): ApiKey {
  const r = k.rateLimits;
  return create(ApiKeySchema, {
    id: k.id,
    name: k.name,
    hint: k.hint,
    budgetTokens: BigInt(k.budgetTokens),
    spentTokens: BigInt(k.spentTokens),
    ...(k.models === null ? {} : { models: create(ModelListSchema, { ids: [...k.models] }) }),
    ...(r === null
      ? {}
      : {
          rateLimits: create(RateLimitsSchema, {
            ...pairMessage(r),
            models: Object.fromEntries(
              Object.entries(r.models ?? {}).map(([m, p]) => [m, create(RateLimitSchema, pairMessage(p))]),
            ),
          }),
        }),
    ...(k.expiresAt === null ? {} : { expiresAt: BigInt(k.expiresAt) }),
    metadata: { ...(k.metadata ?? {}) },
    createdAt: BigInt(k.createdAt),
    ...(k.revokedAt === null ? {} : { revokedAt: BigInt(k.revokedAt) }),
  });
}

/** The AuditLog message of an audit row. */
export function auditLogOf(e: AuditEntry): AuditLog {
  return create(AuditLogSchema, {
    id: e.id,
    at: BigInt(e.at),
    actor: e.actor,
    action: e.action,
    targetId: e.targetId,
    ...(e.before === null ? {} : { before: e.before as JsonObject }),
    ...(e.after === null ? {} : { after: e.after as JsonObject }),
  });
}
