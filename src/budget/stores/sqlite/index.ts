// The SQLite store: its public names (src/budget/index.ts re-exports them).
export { BUDGET_SCHEMA_VERSION } from "./schema.js";
export { createSqliteBudgetStore, type SqliteBudgetStoreOptions } from "./store.js";
