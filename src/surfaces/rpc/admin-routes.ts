// acs.v1.AdminService on the Connect router (Connect, gRPC, gRPC-Web): each method calls the admin
// service the REST routes under /v1/admin/ call, with the completions' call context, shutdown and
// error envelopes; each method's Connect JSON is checked against its input's fields as REST
// checks a body.
import type { DescMessage } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import {
  AdminService,
  CreateKeyRequestSchema,
  GetKeyRequestSchema,
  ListAuditLogsRequestSchema,
  ListKeysRequestSchema,
  RevokeKeyRequestSchema,
  RotateKeyRequestSchema,
  UpdateKeyRequestSchema,
} from "../../../gen/acs/v1/admin_pb.js";
import type { ShutdownLink } from "../../core/index.js";
import type { AdminApi } from "../../service/index.js";
import { unary } from "./routes.js";
import { connectJsonOptions } from "./strict-json-text.js";

const json = (schema: DescMessage) => ({ jsonOptions: connectJsonOptions(schema) });

/** Registers acs.v1.AdminService on a Connect router, over `admin` (the REST routes' service too). */
export function createAdminConnectRoutes(
  admin: AdminApi,
  shutdown?: ShutdownLink,
): (router: ConnectRouter) => void {
  const deps = { shutdown };
  const { method } = AdminService;
  return (router) => {
    router.rpc(method.createKey, unary(deps, admin.createKey), json(CreateKeyRequestSchema));
    router.rpc(method.listKeys, unary(deps, admin.listKeys), json(ListKeysRequestSchema));
    router.rpc(method.getKey, unary(deps, admin.getKey), json(GetKeyRequestSchema));
    router.rpc(method.updateKey, unary(deps, admin.updateKey), json(UpdateKeyRequestSchema));
    router.rpc(method.rotateKey, unary(deps, admin.rotateKey), json(RotateKeyRequestSchema));
    router.rpc(method.revokeKey, unary(deps, admin.revokeKey), json(RevokeKeyRequestSchema));
    router.rpc(method.listAuditLogs, unary(deps, admin.listAuditLogs), json(ListAuditLogsRequestSchema));
  };
}
