export {
  API_KEY_PREFIX,
  apiKeyHint,
  generateApiKey,
  hashApiKey,
  looksLikeApiKey,
  type ParsedAuthorization,
  parseAuthorization,
} from "./api-key.js";
export {
  type BudgetLedger,
  type BudgetLedgerCommonOptions,
  type BudgetLedgerOptions,
  type CreatedKey,
  createBudgetLedger,
  DEFAULT_HOLD_TTL_MS,
  DEFAULT_RECLAIM_INTERVAL_MS,
  type KeyInfo,
  type KeySummary,
  type KeyUsage,
  type PlacedHold,
  UnknownIdError,
} from "./budget-ledger.js";
export type {
  BudgetStore,
  KeyRecord,
  KeyUsageRecord,
  PlaceHoldInput,
  PlaceHoldOutcome,
  SettleResult,
} from "./budget-store.js";
export { type HoldDemand, type HoldPlan, planHold } from "./plan-hold.js";
export {
  BUDGET_SCHEMA_VERSION,
  createSqliteBudgetStore,
  type SqliteBudgetStoreOptions,
} from "./sqlite-budget-store.js";
