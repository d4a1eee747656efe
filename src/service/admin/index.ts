// The admin service (acs.v1.AdminService): one implementation behind REST and Connect.
export { apiKeyOf, auditLogOf } from "./admin-proto.js";
export {
  ADMIN_OFF_MESSAGE,
  type AdminApi,
  createAdminService,
  DEFAULT_PAGE_LIMIT,
  keyNotFound,
  UPDATE_PATHS,
} from "./admin-service.js";
