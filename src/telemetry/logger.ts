import { createRequire } from "node:module";
import type { DestinationStream } from "pino";
import { pino } from "pino";
import type prettyFactory from "pino-pretty";
import type { LogLevel } from "../config/index.js";

/** Options of {@link createLogger}. */
export interface LoggerOptions {
  /** pino level (ACS_LOG_LEVEL). */
  readonly level: LogLevel;
  /** `json`: one JSON object a line (the default, for log shippers); `pretty`: pino-pretty's text, for people. */
  readonly format: "json" | "pretty";
  /** Where lines go. @default standard output */
  readonly destination?: DestinationStream | NodeJS.WritableStream;
}

/**
 * The gateway's logger: pino named `acs-gateway`, JSON lines by default; with `format: "pretty"`
 * each line is rendered by pino-pretty in this process (time, level, message, then the fields;
 * colours only on a terminal). Every line about a request carries its id as `requestId`.
 */
export function createLogger(options: LoggerOptions): pino.Logger {
  const base = { level: options.level, name: "acs-gateway" };
  if (options.format === "pretty") {
    // Loaded only for this format: JSON lines (the default) do without it, in every process of a
    // cluster (~2.5 MB of resident memory each).
    const pretty = createRequire(import.meta.url)("pino-pretty") as typeof prettyFactory;
    const destination = options.destination ?? process.stdout;
    return pino(
      base,
      pretty({
        destination,
        colorize: destination === process.stdout && process.stdout.isTTY === true,
        translateTime: "SYS:yyyy-mm-dd HH:MM:ss.l",
        ignore: "pid,hostname",
        sync: true,
      }),
    );
  }
  return options.destination === undefined ? pino(base) : pino(base, options.destination);
}
