export type {
  AdminKeyRecord,
  AdminStore,
  AuditEntry,
  AuditStamp,
  Page,
  PageRequest,
} from "./admin-store.js";
export {
  ADMIN_KEY_PREFIX,
  API_KEY_PREFIX,
  apiKeyHint,
  generateApiKey,
  hashApiKey,
  looksLikeApiKey,
  type ParsedAuthorization,
  parseAuthorization,
} from "./api-key.js";
export type {
  BudgetStore,
  DailyUsageRecord,
  KeyRecord,
  KeyState,
  KeyUsageRecord,
  LeasePeriod,
  LeaseSyncInput,
  LeaseSyncOutcome,
  PeriodRecord,
  PlaceHoldInput,
  PlaceHoldOutcome,
  ReclaimCount,
  SettleResult,
} from "./budget-store.js";
export {
  checkExpiresAt,
  checkMetadata,
  checkRateLimits,
  type KeyMetadata,
  KeySettingError,
  METADATA_MAX_KEY_CHARS,
  METADATA_MAX_PAIRS,
  METADATA_MAX_VALUE_CHARS,
  type RateLimitPair,
  type RateLimits,
} from "./key-settings.js";
export {
  DEFAULT_LEASE_SETTINGS,
  type LeaseOptions,
  type LeaseSettings,
  leaseGrant,
} from "./leases/settings.js";
export type {
  AdminKeyInfo,
  BudgetLedger,
  CountNeeded,
  CreatedAdminKey,
  CreatedKey,
  KeyChanges,
  KeyInfo,
  KeySettings,
  KeySummary,
  KeyUsage,
  PlacedHold,
} from "./ledger/api.js";
export { createBudgetLedger } from "./ledger/create-ledger.js";
export { UnknownIdError } from "./ledger/errors.js";
export { CLI_ACTOR, MAX_PAGE_LIMIT } from "./ledger/key-admin.js";
export {
  type BudgetLedgerCommonOptions,
  type BudgetLedgerOptions,
  DEFAULT_AUTH_CACHE_TTL_MS,
  DEFAULT_HOLD_TTL_MS,
  DEFAULT_RECLAIM_INTERVAL_MS,
  isPostgresUrl,
} from "./ledger/options.js";
export { utcDay } from "./ledger/utc-day.js";
export { BUDGET_PERIODS, type BudgetPeriod, isBudgetPeriod, nextBoundary, periodStart } from "./period.js";
export { demandTokens, type HoldDemand, type HoldPlan, planHold } from "./plan-hold.js";
export {
  type LedgerSettleResult,
  MAX_PENDING_SETTLES,
  type PendingSettleResult,
  type WritableChange,
} from "./store-writes.js";
export {
  createPostgresBudgetStore,
  POSTGRES_BUDGET_SCHEMA_VERSION,
  type PostgresBudgetStoreOptions,
} from "./stores/postgres/index.js";
export {
  BUDGET_SCHEMA_VERSION,
  createSqliteBudgetStore,
  type SqliteBudgetStoreOptions,
} from "./stores/sqlite/index.js";
export {
  chargedOf,
  createUsageLog,
  type UsageEntry,
  type UsageLog,
  type UsageLogOptions,
} from "./usage/usage-log.js";
export {
  MAX_USAGE_FILTER_VALUES,
  USAGE_BUCKET_WIDTHS,
  type UsageBucket,
  type UsageBucketWidth,
  type UsageCompletionsPage,
  type UsageCompletionsQuery,
  type UsageCompletionsResult,
  usageCompletions,
} from "./usage/usage-query.js";
export type {
  UsageAggregateQuery,
  UsageAggregateRow,
  UsageGroupBy,
  UsageRecord,
} from "./usage/usage-record.js";
