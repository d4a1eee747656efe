// The admin service (acs.v1.AdminService): the one implementation behind the REST routes under
// /v1/admin/ and the Connect/gRPC/gRPC-Web ones. Every call authenticates an admin key first,
// then calls the ledger's admin operations (the keys CLI calls the same ones), its refusals
// turned into the catalogue's errors.
import { create } from "@bufbuild/protobuf";
import {
  type CreateKeyRequest,
  type CreateKeyResponse,
  CreateKeyResponseSchema,
  type GetKeyRequest,
  type GetKeyResponse,
  GetKeyResponseSchema,
  KeySettingsSchema,
  type ListAuditLogsRequest,
  type ListAuditLogsResponse,
  ListAuditLogsResponseSchema,
  type ListKeysRequest,
  type ListKeysResponse,
  ListKeysResponseSchema,
  type RevokeKeyRequest,
  type RevokeKeyResponse,
  RevokeKeyResponseSchema,
  type RotateKeyRequest,
  type RotateKeyResponse,
  RotateKeyResponseSchema,
  type UpdateKeyRequest,
  type UpdateKeyResponse,
  UpdateKeyResponseSchema,
} from "../../../gen/acs/v1/admin_pb.js";
import {
  type BudgetLedger,
  type KeyChanges,
  KeySettingError,
  UnknownIdError,
  type UsageCompletionsPage,
  type UsageCompletionsQuery,
} from "../../budget/index.js";
import { ApiError, invalidRequest } from "../../core/errors/index.js";
import type { CallContext } from "../types.js";
import { apiKeyOf, auditLogOf, safeInt, settingsOf } from "./admin-proto.js";

/** The page size of a list when the request names none. */
export const DEFAULT_PAGE_LIMIT = 20;

/** The settings UpdateKey's update_mask may name. */
export const UPDATE_PATHS: readonly string[] = [
  "name",
  "budget_tokens",
  "models",
  "rate_limits",
  "expires_at",
  "metadata",
];

/** The admin service both surfaces call. Every method throws ApiError for a refusal. */
export interface AdminApi {
  /**
   * Checks the admin key, so that a surface refuses a bad one (401, 403) before it decodes the
   * body; every other method checks it again.
   */
  authenticate(ctx: CallContext): Promise<void>;
  createKey(request: CreateKeyRequest, ctx: CallContext): Promise<CreateKeyResponse>;
  listKeys(request: ListKeysRequest, ctx: CallContext): Promise<ListKeysResponse>;
  getKey(request: GetKeyRequest, ctx: CallContext): Promise<GetKeyResponse>;
  updateKey(request: UpdateKeyRequest, ctx: CallContext): Promise<UpdateKeyResponse>;
  rotateKey(request: RotateKeyRequest, ctx: CallContext): Promise<RotateKeyResponse>;
  revokeKey(request: RevokeKeyRequest, ctx: CallContext): Promise<RevokeKeyResponse>;
  listAuditLogs(request: ListAuditLogsRequest, ctx: CallContext): Promise<ListAuditLogsResponse>;
  /**
   * OpenAI's completions Usage API page over the usage records (src/budget/usage/usage-query.ts).
   * `readQuery` is called once the admin key is checked (so a caller without one hears 401/403
   * before anything of its query); it and the query throw 400 `invalid_request` naming the
   * parameter. REST only (`GET /v1/admin/usage/completions`).
   */
  usageCompletions(readQuery: () => UsageCompletionsQuery, ctx: CallContext): Promise<UsageCompletionsPage>;
}

/** The message of the admin API when the gateway runs without keys. */
export const ADMIN_OFF_MESSAGE =
  "The admin API is off: this gateway runs without keys (ACS_DB is not set), so there are no keys to administer.";

/** 404 `key_not_found` for an unknown key id. */
export function keyNotFound(id: string): ApiError {
  return new ApiError("key_not_found", `No API key with id '${id}'.`, { param: "id" });
}

/** The ledger's refusals as the catalogue's: a setting → 400 with its param, an unknown id → 404. */
function refusalOf(err: unknown): unknown {
  if (err instanceof KeySettingError) return invalidRequest(err.param, err.message);
  if (err instanceof UnknownIdError) return keyNotFound(err.id);
  return err;
}

/** The UpdateKey request as the ledger's changes; 400 (param `update_mask`) for an unknown path. */
function changesOf(request: UpdateKeyRequest): KeyChanges {
  const paths = new Set(request.updateMask?.paths ?? []);
  for (const p of paths) {
    if (!UPDATE_PATHS.includes(p)) {
      throw invalidRequest(
        "update_mask",
        `Invalid value for 'update_mask': '${p}' is not a key setting (${UPDATE_PATHS.join(", ")}).`,
      );
    }
  }
  const settings = request.settings;
  const changes: KeyChanges = settings === undefined ? {} : settingsOf(settings, paths);
  if (settings === undefined && paths.size > 0) {
    throw invalidRequest("settings", "UpdateKey names settings in update_mask but sends no settings.");
  }
  return {
    ...changes,
    ...(request.addBudgetTokens === undefined
      ? {}
      : { addTokens: safeInt(request.addBudgetTokens, "add_budget_tokens", 1) }),
  };
}

/** A page request of a list message (limit 1–100, default 20). */
function pageOf(request: { after?: string | undefined; limit?: number | undefined }): {
  after?: string;
  limit: number;
} {
  return {
    ...(request.after === undefined ? {} : { after: request.after }),
    limit: request.limit ?? DEFAULT_PAGE_LIMIT,
  };
}

/** The list shape's ids of a page's first and last items. */
function ends(items: readonly { id: string }[]): { firstId?: string; lastId?: string } {
  const first = items[0]?.id;
  const last = items.at(-1)?.id;
  return {
    ...(first === undefined ? {} : { firstId: first }),
    ...(last === undefined ? {} : { lastId: last }),
  };
}

/**
 * The admin service over the ledger (undefined: keys off, every call 404 `unknown_route` —
 * Connect `unimplemented` — with {@link ADMIN_OFF_MESSAGE}).
 */
export function createAdminService(ledger: BudgetLedger | undefined): AdminApi {
  /** Authenticates the admin key, then runs fn with its id as the actor; the ledger's refusals mapped. */
  const as = async <T>(ctx: CallContext, fn: (l: BudgetLedger, actor: string) => Promise<T>): Promise<T> => {
    if (ledger === undefined) throw new ApiError("unknown_route", ADMIN_OFF_MESSAGE);
    const admin = await ledger.authenticateAdmin(ctx.authorization);
    try {
      return await fn(ledger, admin.id);
    } catch (err) {
      throw refusalOf(err);
    }
  };
  return {
    authenticate: (ctx) => as(ctx, async () => undefined),
    createKey: (request, ctx) =>
      as(ctx, async (l, actor) => {
        const settings = settingsOf(request.settings ?? create(KeySettingsSchema));
        const { key, ...summary } = await l.createKey(
          { ...settings, budgetTokens: settings.budgetTokens ?? 0 },
          actor,
        );
        return create(CreateKeyResponseSchema, { apiKey: apiKeyOf(summary), key });
      }),
    listKeys: (request, ctx) =>
      as(ctx, async (l) => {
        const page = await l.listKeysPage(pageOf(request));
        return create(ListKeysResponseSchema, {
          data: page.items.map(apiKeyOf),
          ...ends(page.items),
          hasMore: page.hasMore,
        });
      }),
    getKey: (request, ctx) =>
      as(ctx, async (l) => create(GetKeyResponseSchema, { apiKey: apiKeyOf(await l.getKey(request.id)) })),
    updateKey: (request, ctx) =>
      as(ctx, async (l, actor) =>
        create(UpdateKeyResponseSchema, {
          apiKey: apiKeyOf(await l.updateKey(request.id, changesOf(request), actor)),
        }),
      ),
    rotateKey: (request, ctx) =>
      as(ctx, async (l, actor) => {
        const { key, ...summary } = await l.rotateKey(request.id, actor);
        return create(RotateKeyResponseSchema, { apiKey: apiKeyOf(summary), key });
      }),
    revokeKey: (request, ctx) =>
      as(ctx, async (l, actor) =>
        create(RevokeKeyResponseSchema, { apiKey: apiKeyOf(await l.revoke(request.id, actor)) }),
      ),
    listAuditLogs: (request, ctx) =>
      as(ctx, async (l) => {
        const page = await l.listAuditLogs(pageOf(request));
        return create(ListAuditLogsResponseSchema, {
          data: page.items.map(auditLogOf),
          ...ends(page.items),
          hasMore: page.hasMore,
        });
      }),
    usageCompletions: (readQuery, ctx) => as(ctx, (l) => l.usageCompletions(readQuery())),
  };
}
