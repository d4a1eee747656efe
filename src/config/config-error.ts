/**
 * A mistake in the configuration (environment or models file). Its message is one line fit for
 * the operator, naming the variable, file and key at fault; src/main.ts prints it and exits 2.
 */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
}
