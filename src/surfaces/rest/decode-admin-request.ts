// REST's strict decoders of the admin API's bodies and queries (proto/API.md §11) into the
// acs.v1.AdminService requests: the completions' parser and type refusals (§4: unknown fields
// first, param = the field, dotted for nested ones), `null` = left out on create and "clear" on
// update (where the body's keys are the update mask). Ranges and caps are the service's and the
// ledger's (one place for each rule).
import { create } from "@bufbuild/protobuf";
import { FieldMaskSchema } from "@bufbuild/protobuf/wkt";
import {
  type CreateKeyRequest,
  CreateKeyRequestSchema,
  type KeySettings,
  KeySettingsSchema,
  type ListKeysRequest,
  ListKeysRequestSchema,
  ModelListSchema,
  type RateLimit,
  RateLimitSchema,
  RateLimitsSchema,
  type UpdateKeyRequest,
  UpdateKeyRequestSchema,
} from "../../../gen/acs/v1/admin_pb.js";
import { invalidRequest } from "../../core/errors/index.js";
import { INT64, invalidType, unknownField } from "../../core/json/decode-refusals.js";
import { type JsonObject, parseStrictJsonAsync } from "../../core/json/strict-json.js";
import { isObject, readInteger, readListItems, readString } from "./read-json-values.js";

/** The settings of a key a create or update body may hold (update adds `add_budget_tokens`). */
const SETTING_FIELDS = ["name", "budget_tokens", "models", "rate_limits", "expires_at", "metadata"] as const;
const PAIR_FIELDS = ["requests_per_minute", "tokens_per_minute"] as const;

/** Unknown keys of `object` refused first (param = prefix + key). */
function refuseUnknown(object: JsonObject, known: readonly string[], prefix: string): void {
  for (const key of Object.keys(object)) if (!known.includes(key)) throw unknownField(prefix + key);
}

function readObject(value: unknown, param: string): JsonObject {
  if (!isObject(value)) throw invalidType(param, "an object");
  return value;
}

function readPair(value: unknown, param: string, more: readonly string[] = []): Omit<RateLimit, "$typeName"> {
  const o = readObject(value, param);
  refuseUnknown(o, [...PAIR_FIELDS, ...more], `${param}.`);
  const rpm = o.requests_per_minute;
  const tpm = o.tokens_per_minute;
  return {
    ...(rpm == null ? {} : { requestsPerMinute: readInteger(rpm, `${param}.requests_per_minute`, INT64) }),
    ...(tpm == null ? {} : { tokensPerMinute: readInteger(tpm, `${param}.tokens_per_minute`, INT64) }),
  };
}

function readRateLimits(value: unknown, param: string) {
  const o = readObject(value, param);
  const models = o.models == null ? {} : readObject(o.models, `${param}.models`);
  return create(RateLimitsSchema, {
    ...readPair(o, param, ["models"]),
    models: Object.fromEntries(
      Object.entries(models).map(([m, p]) => [
        m,
        create(RateLimitSchema, readPair(p, `${param}.models.${m}`)),
      ]),
    ),
  });
}

function readMetadata(value: unknown, param: string): Record<string, string> {
  const o = readObject(value, param);
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, readString(v, `${param}.${k}`)]));
}

/** One setting's value (never null) into the KeySettings init. */
function readSetting(
  init: Record<string, unknown>,
  key: (typeof SETTING_FIELDS)[number],
  value: unknown,
): void {
  switch (key) {
    case "name":
      init.name = readString(value, key);
      return;
    case "budget_tokens":
      init.budgetTokens = readInteger(value, key, INT64);
      return;
    case "models":
      init.models = create(ModelListSchema, { ids: readListItems(value, key, readString) });
      return;
    case "rate_limits":
      init.rateLimits = readRateLimits(value, key);
      return;
    case "expires_at":
      init.expiresAt = readInteger(value, key, INT64);
      return;
    case "metadata":
      init.metadata = readMetadata(value, key);
      return;
  }
}

/** The settings of a body's keys (null ones left out), and the setting keys it holds (null ones too). */
function readSettings(body: JsonObject): { settings: KeySettings; present: string[] } {
  const init: Record<string, unknown> = {};
  const present: string[] = [];
  for (const key of SETTING_FIELDS) {
    if (!(key in body)) continue;
    present.push(key);
    if (body[key] !== null) readSetting(init, key, body[key]);
  }
  return { settings: create(KeySettingsSchema, init), present };
}

async function parseObject(body: Uint8Array): Promise<JsonObject> {
  const json = body.length === 0 ? {} : await parseStrictJsonAsync(body);
  if (!isObject(json)) throw invalidRequest(null, "The request body must be a JSON object.");
  return json;
}

/** `POST /v1/admin/keys`: `{name, budget_tokens, models, rate_limits, expires_at, metadata}`. */
export async function decodeCreateKeyRequest(body: Uint8Array): Promise<CreateKeyRequest> {
  const json = await parseObject(body);
  refuseUnknown(json, SETTING_FIELDS, "");
  return create(CreateKeyRequestSchema, { settings: readSettings(json).settings });
}

/** `POST /v1/admin/keys/{id}`: the settings to change (their keys are the mask; null clears) and `add_budget_tokens`. */
export async function decodeUpdateKeyRequest(id: string, body: Uint8Array): Promise<UpdateKeyRequest> {
  const json = await parseObject(body);
  refuseUnknown(json, [...SETTING_FIELDS, "add_budget_tokens"], "");
  const { settings, present } = readSettings(json);
  const add = json.add_budget_tokens;
  return create(UpdateKeyRequestSchema, {
    id,
    settings,
    updateMask: create(FieldMaskSchema, { paths: present }),
    ...(add == null ? {} : { addBudgetTokens: readInteger(add, "add_budget_tokens", INT64) }),
  });
}

/** A body that must hold nothing (rotate, revoke): none, or `{}`. */
export async function decodeEmptyBody(body: Uint8Array): Promise<void> {
  refuseUnknown(await parseObject(body), [], "");
}

/**
 * A list's query (`after`, `limit`): unknown parameters refused (param = the name), each given
 * once; `limit` an integer (its range is the ledger's: 1–100).
 */
export function decodeListQuery(query: unknown): Omit<ListKeysRequest, "$typeName"> {
  const q = (query ?? {}) as Record<string, unknown>;
  refuseUnknown(q, ["after", "limit"], "");
  for (const [k, v] of Object.entries(q)) if (typeof v !== "string") throw invalidType(k, "one value");
  const { after, limit } = q as { after?: string; limit?: string };
  if (limit !== undefined && !/^-?[0-9]{1,10}$/.test(limit)) throw invalidType("limit", "an integer");
  return create(ListKeysRequestSchema, {
    ...(after === undefined ? {} : { after }),
    ...(limit === undefined ? {} : { limit: Math.max(-1, Math.min(Number(limit), 2 ** 31 - 1)) }),
  });
}
