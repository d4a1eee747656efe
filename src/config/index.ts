export {
  type Config,
  ConfigError,
  type EmbeddedEngineConfig,
  isLoopback,
  limits,
  loadConfig,
  type ModelConfig,
  parseModelsFile,
} from "./config.js";
