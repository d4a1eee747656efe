export {
  ADMIN_OFF_MESSAGE,
  type AdminApi,
  apiKeyOf,
  auditLogOf,
  createAdminService,
  DEFAULT_PAGE_LIMIT,
  keyNotFound,
  UPDATE_PATHS,
} from "./admin/index.js";
export {
  ADMISSION_RETRY_AFTER_SECONDS,
  type Admission,
  type AdmissionDemand,
  type AdmissionLimits,
  type AdmissionTicket,
  admissionLimitsFrom,
  createAdmission,
  type KeyInFlight,
  type LocalAdmission,
  rateLimited,
  upstreamShareCap,
} from "./admission.js";
export { maxPromptsPerRequest, tooManyPrompts } from "./checks.js";
export { clampedHeader } from "./completions/check-order.js";
export { type CompletionsServiceDeps, createCompletionsService } from "./completions/index.js";
export {
  type AdmitReplica,
  createModelRegistry,
  type ModelRegistry,
  type ModelStatus,
  type ModelsSource,
  type ModelUpstream,
  modelNotFound,
  type ServedModel,
} from "./model-registry.js";
export type { KeyInfo, Ledger } from "./ports.js";
export { createTokenizeCalls, type TokenizeCallsDeps } from "./tokenize-calls.js";
export type { CallContext, CompletionsApi } from "./types.js";
export { validateRequest, validateTokensRequest, violationParam } from "./validate-request.js";
