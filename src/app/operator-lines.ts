// What the operator reads of a gateway process that cannot start as told: one line on stderr and
// exit code 2 (src/main.ts, src/app/gateway-process.ts, the cluster's primary), and the warning
// that keys are off.
import type { Logger } from "pino";

/** Exit code of an operator's mistake (configuration, a port in use): one line on stderr. */
export const USAGE_EXIT = 2;

/** Writes `acs-gateway: <message>` on stderr and exits with {@link USAGE_EXIT}. */
export function refuse(message: string): never {
  process.stderr.write(`acs-gateway: ${message}\n`);
  process.exit(USAGE_EXIT);
}

/** The warning of a gateway without ACS_DB: no keys, no Budgets (it listens on loopback only). */
export function warnKeysOff(logger: Logger, host: string): void {
  logger.warn({ host }, "ACS_DB is not set: authentication and Budgets are OFF (loopback only)");
}
