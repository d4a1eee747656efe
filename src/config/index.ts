export { checkDbPath } from "./check-db-path.js";
export {
  type BudgetDb,
  type Config,
  type EmbeddedEngineConfig,
  type EnvSettings,
  isLoopback,
  limits,
  loadConfig,
  machineryDefaults,
  parseBudgetDb,
} from "./config.js";
export { ConfigError } from "./config-error.js";
export { dbOpenError, redactDb } from "./db-open-error.js";
export { type LogLevel, logLevels, parseEnv } from "./env-schema.js";
export { type ModelConfig, parseModelsFile, type UpstreamConfig } from "./models-file.js";
