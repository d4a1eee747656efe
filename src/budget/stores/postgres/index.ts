// The PostgreSQL store: its public names (src/budget/index.ts re-exports them).
export { POSTGRES_BUDGET_SCHEMA_VERSION } from "./schema.js";
export { createPostgresBudgetStore, type PostgresBudgetStoreOptions } from "./store.js";
