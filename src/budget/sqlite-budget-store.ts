// The SQLite store lives in ./stores/sqlite/; this path is kept for the imports that still name it
// (./ledger/create-ledger.ts).
export {
  BUDGET_SCHEMA_VERSION,
  createSqliteBudgetStore,
  type SqliteBudgetStoreOptions,
} from "./stores/sqlite/index.js";
