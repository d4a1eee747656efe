export { checkDbPath } from "./check-db-path.js";
export {
  type BudgetDb,
  type Config,
  type EmbeddedEngineConfig,
  isLoopback,
  limits,
  loadConfig,
  type ModelConfig,
  parseBudgetDb,
  type UpstreamConfig,
} from "./config.js";
export { ConfigError } from "./config-error.js";
export { dbOpenError, redactDb } from "./db-open-error.js";
export { type LogLevel, logLevels, parseEnv } from "./env-schema.js";
export { parseModelsFile } from "./models-file.js";
