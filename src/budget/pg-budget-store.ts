// The PostgreSQL store lives in ./stores/postgres/; this path is kept for the imports that still
// name it (./ledger/create-ledger.ts).
export {
  createPostgresBudgetStore,
  POSTGRES_BUDGET_SCHEMA_VERSION,
  type PostgresBudgetStoreOptions,
} from "./stores/postgres/index.js";
