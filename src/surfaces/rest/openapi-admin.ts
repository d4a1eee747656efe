// The admin API's part of the OpenAPI document (src/surfaces/rest/openapi.ts; proto/API.md §11):
// its paths under /v1/admin/ and their schemas (an API key, an audit log entry, the list shape).
// `/rotate` and `/revoke` come before `/v1/admin/keys/{id}`, so that a path template matcher that
// takes the first match finds them.
import { errorsOf } from "./openapi-errors.js";
import {
  type JsonSchema,
  type OpenApiOperation,
  orNull,
  ref,
  requestIdHeader,
} from "./openapi-json-schema.js";

const adminSecurity = [{ adminKey: [] }];
const ms = (description: string): JsonSchema => ({ type: "integer", minimum: 0, description });
const perMinute = { type: "integer", minimum: 1 } as const;
const pair = {
  type: "object",
  additionalProperties: false,
  properties: { requests_per_minute: perMinute, tokens_per_minute: perMinute },
} as const;

/** A key's settings, as create and update take them. */
const settingProperties: Record<string, JsonSchema> = {
  name: { type: "string" },
  budget_tokens: { type: "integer", minimum: 0, description: "The Budget in tokens (default 0)." },
  models: orNull({ type: "array", items: { type: "string", minLength: 1 } }),
  rate_limits: orNull(ref("RateLimits")),
  expires_at: orNull(ms("When the key stops working, Unix epoch ms.")),
  metadata: orNull(ref("Metadata")),
};

/** The admin API's component schemas. */
export const adminSchemas: Record<string, JsonSchema> = {
  RateLimits: {
    type: "object",
    description: "Requests and tokens per minute, for the key and per model (proto/API.md §9, Rate limits).",
    additionalProperties: false,
    properties: {
      ...pair.properties,
      models: { type: "object", additionalProperties: pair },
    },
  },
  Metadata: {
    type: "object",
    description: "At most 16 pairs; keys 1–64 characters, values at most 512.",
    maxProperties: 16,
    additionalProperties: { type: "string", maxLength: 512 },
  },
  KeySettings: {
    type: "object",
    additionalProperties: false,
    properties: settingProperties,
  },
  KeyUpdate: {
    type: "object",
    description: "The settings to change (a key left out is kept; `null` clears it), and tokens to add.",
    additionalProperties: false,
    properties: { ...settingProperties, add_budget_tokens: { type: "integer", minimum: 1 } },
  },
  ApiKey: {
    type: "object",
    required: [
      "object",
      "id",
      "name",
      "hint",
      "budget_tokens",
      "spent_tokens",
      "models",
      "rate_limits",
      "expires_at",
      "metadata",
      "created_at",
      "revoked_at",
    ],
    additionalProperties: false,
    properties: {
      object: { const: "api_key" },
      id: { type: "string", pattern: "^key_[0-9a-f]{12}$" },
      name: { type: "string" },
      hint: { type: "string", description: "`acs-…` + the secret's last 4 characters." },
      budget_tokens: { type: "integer", minimum: 0 },
      spent_tokens: { type: "integer", minimum: 0 },
      models: orNull({ type: "array", items: { type: "string" } }),
      rate_limits: orNull(ref("RateLimits")),
      expires_at: orNull(ms("Unix epoch ms.")),
      metadata: orNull(ref("Metadata")),
      created_at: ms("Unix epoch ms."),
      revoked_at: orNull(ms("Unix epoch ms.")),
      key: {
        type: "string",
        pattern: "^acs-[A-Za-z0-9_-]{43}$",
        description: "The secret: only in the answers of create and rotate.",
      },
    },
  },
  AuditLog: {
    type: "object",
    required: ["object", "id", "at", "actor", "action", "target_id", "before", "after"],
    additionalProperties: false,
    properties: {
      object: { const: "audit_log" },
      id: { type: "string", pattern: "^audit_[0-9a-f]{16}$" },
      at: ms("Unix epoch ms."),
      actor: { type: "string", description: "The admin key's id (`adm_…`), or `cli`." },
      action: {
        type: "string",
        description: "e.g. `api_key.created`, `api_key.updated`, `api_key.rotated`.",
      },
      target_id: { type: "string" },
      before: orNull({ type: "object" }),
      after: orNull({ type: "object" }),
    },
  },
  ApiKeyList: listOf("ApiKey"),
  AuditLogList: listOf("AuditLog"),
};

function listOf(item: string): JsonSchema {
  return {
    type: "object",
    description: "OpenAI's list shape, newest first.",
    required: ["object", "data", "first_id", "last_id", "has_more"],
    additionalProperties: false,
    properties: {
      object: { const: "list" },
      data: { type: "array", items: ref(item) },
      first_id: orNull({ type: "string" }),
      last_id: orNull({ type: "string" }),
      has_more: { type: "boolean" },
    },
  };
}

const idParameter = {
  name: "id",
  in: "path",
  required: true,
  description: "The key's id (`key_` + 12 hex).",
  schema: { type: "string" },
};
const pageParameters = [
  {
    name: "after",
    in: "query",
    description: "The last id of the previous page.",
    schema: { type: "string" },
  },
  {
    name: "limit",
    in: "query",
    description: "Items per page, 1–100 (default 20).",
    schema: { type: "integer", minimum: 1, maximum: 100 },
  },
];

/** One admin operation: its key, its answer's schema, and the errors of the admin API. */
function adminOperation(
  operationId: string,
  summary: string,
  answer: string,
  extra: Partial<OpenApiOperation> = {},
): OpenApiOperation {
  return {
    operationId,
    tags: ["admin"],
    summary,
    security: adminSecurity,
    ...extra,
    responses: {
      "200": {
        description: `The ${answer === "ApiKey" ? "key" : "page"}.`,
        headers: requestIdHeader,
        content: { "application/json": { schema: ref(answer) } },
      },
      ...errorsOf(400, 401, 403, 404, 413, 415, 500, 503),
    },
  };
}

const body = (schema: string) => ({
  requestBody: { required: false, content: { "application/json": { schema: ref(schema) } } },
});
const emptyBody = {
  requestBody: {
    required: false,
    content: { "application/json": { schema: { type: "object", additionalProperties: false } } },
  },
};

/** The admin paths (`acs.v1.AdminService` on Connect). */
export const adminPaths: Record<string, Record<string, OpenApiOperation>> = {
  "/v1/admin/keys": {
    post: adminOperation(
      "createKey",
      "Create an API key (its secret `key` shown once)",
      "ApiKey",
      body("KeySettings"),
    ),
    get: adminOperation("listKeys", "List API keys, newest first", "ApiKeyList", {
      parameters: pageParameters,
    }),
  },
  "/v1/admin/keys/{id}/rotate": {
    post: adminOperation("rotateKey", "A new secret for the key (same id and usage; shown once)", "ApiKey", {
      parameters: [idParameter],
      ...emptyBody,
    }),
  },
  "/v1/admin/keys/{id}/revoke": {
    post: adminOperation("revokeKey", "Revoke the key", "ApiKey", {
      parameters: [idParameter],
      ...emptyBody,
    }),
  },
  "/v1/admin/keys/{id}": {
    get: adminOperation("retrieveKey", "One API key", "ApiKey", { parameters: [idParameter] }),
    post: adminOperation("updateKey", "Change a key's settings, add to its Budget", "ApiKey", {
      parameters: [idParameter],
      ...body("KeyUpdate"),
    }),
  },
  "/v1/admin/audit_logs": {
    get: adminOperation("listAuditLogs", "The audit log, newest first", "AuditLogList", {
      parameters: pageParameters,
    }),
  },
};
