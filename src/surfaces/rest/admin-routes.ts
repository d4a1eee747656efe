// The admin API's REST routes under /v1/admin/ (proto/API.md §11), registered in the REST plugin
// beside the completions routes (its hooks: request ids, strict JSON bodies, the error envelope):
// each checks the admin key first (401 / 403 before the body), decodes strictly, and calls the
// admin service (the one the Connect routes call).
import { create } from "@bufbuild/protobuf";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ListAuditLogsRequestSchema, ListKeysRequestSchema } from "../../../gen/acs/v1/admin_pb.js";
import { limits } from "../../config/index.js";
import type { ShutdownLink } from "../../core/index.js";
import type { AdminApi } from "../../service/index.js";
import { createCallContext } from "./call-context.js";
import {
  decodeCreateKeyRequest,
  decodeEmptyBody,
  decodeListQuery,
  decodeUpdateKeyRequest,
} from "./decode-admin-request.js";
import { takeJsonBody } from "./json-body.js";
import { renderApiKey, renderAuditLog, renderList } from "./render-admin.js";

/** The admin routes and the methods each takes (`{id}`: a key id), for 405 answers. */
export const adminRouteMethods: Readonly<Record<string, readonly string[]>> = {
  "/v1/admin/keys": ["GET", "HEAD", "POST"],
  "/v1/admin/keys/{id}": ["GET", "HEAD", "POST"],
  "/v1/admin/keys/{id}/rotate": ["POST"],
  "/v1/admin/keys/{id}/revoke": ["POST"],
  "/v1/admin/audit_logs": ["GET", "HEAD"],
  "/v1/admin/usage/completions": ["GET", "HEAD"],
};

/** The methods an admin path takes, or undefined when it is not one. */
export function adminAllowedMethods(path: string): readonly string[] | undefined {
  const m = /^\/v1\/admin\/keys\/[^/]+(\/rotate|\/revoke)?$/.exec(path);
  if (m !== null) return adminRouteMethods[`/v1/admin/keys/{id}${m[1] ?? ""}`];
  return adminRouteMethods[path];
}

interface AdminScope {
  readonly admin: AdminApi;
  readonly shutdown: ShutdownLink;
}

const JSON_TYPE = "application/json; charset=utf-8";

/** The body of a POST (none: empty), after the admin key was checked; JSON only when there is one. */
async function bodyOf(request: FastifyRequest): Promise<Uint8Array> {
  if (request.body === undefined || (request.body as Uint8Array).length === 0) return new Uint8Array(0);
  return takeJsonBody(request);
}

const idOf = (request: FastifyRequest): string => (request.params as { id?: string }).id ?? "";

type Handler = (
  scope: AdminScope,
  ctx: ReturnType<typeof createCallContext>,
  request: FastifyRequest,
) => Promise<unknown>;

/** A route's handler: the admin key first, then `handle`'s JSON answer. */
function route(scope: AdminScope, handle: Handler) {
  return async (request: FastifyRequest, reply: FastifyReply) => {
    const ctx = createCallContext(request, reply, scope.shutdown);
    await scope.admin.authenticate(ctx);
    const json = await handle(scope, ctx, request);
    return reply.type(JSON_TYPE).send(JSON.stringify(json));
  };
}

const createKey: Handler = async ({ admin }, ctx, request) => {
  const r = await admin.createKey(await decodeCreateKeyRequest(await bodyOf(request)), ctx);
  return renderApiKey(r.apiKey, r.key);
};

const listKeys: Handler = async ({ admin }, ctx, request) => {
  const r = await admin.listKeys(create(ListKeysRequestSchema, decodeListQuery(request.query)), ctx);
  return renderList(
    r.data.map((k) => renderApiKey(k)),
    r,
  );
};

const getKey: Handler = async ({ admin }, ctx, request) =>
  renderApiKey((await admin.getKey({ $typeName: "acs.v1.GetKeyRequest", id: idOf(request) }, ctx)).apiKey);

const updateKey: Handler = async ({ admin }, ctx, request) => {
  const r = await admin.updateKey(await decodeUpdateKeyRequest(idOf(request), await bodyOf(request)), ctx);
  return renderApiKey(r.apiKey);
};

const rotateKey: Handler = async ({ admin }, ctx, request) => {
  await decodeEmptyBody(await bodyOf(request));
  const r = await admin.rotateKey({ $typeName: "acs.v1.RotateKeyRequest", id: idOf(request) }, ctx);
  return renderApiKey(r.apiKey, r.key);
};

const revokeKey: Handler = async ({ admin }, ctx, request) => {
  await decodeEmptyBody(await bodyOf(request));
  return renderApiKey(
    (await admin.revokeKey({ $typeName: "acs.v1.RevokeKeyRequest", id: idOf(request) }, ctx)).apiKey,
  );
};

const listAuditLogs: Handler = async ({ admin }, ctx, request) => {
  const { after, limit } = decodeListQuery(request.query);
  const r = await admin.listAuditLogs(
    create(ListAuditLogsRequestSchema, {
      ...(after === undefined ? {} : { after }),
      ...(limit === undefined ? {} : { limit }),
    }),
    ctx,
  );
  return renderList(r.data.map(renderAuditLog), r);
};

/** Registers the admin routes on the REST plugin's instance. */
export function registerAdminRoutes(app: FastifyInstance, scope: AdminScope): void {
  const bodyLimit = limits.bodyLimitBytes;
  app.post("/v1/admin/keys", { bodyLimit }, route(scope, createKey));
  app.get("/v1/admin/keys", route(scope, listKeys));
  app.get("/v1/admin/keys/:id", route(scope, getKey));
  app.post("/v1/admin/keys/:id", { bodyLimit }, route(scope, updateKey));
  app.post("/v1/admin/keys/:id/rotate", { bodyLimit }, route(scope, rotateKey));
  app.post("/v1/admin/keys/:id/revoke", { bodyLimit }, route(scope, revokeKey));
  app.get("/v1/admin/audit_logs", route(scope, listAuditLogs));
}
