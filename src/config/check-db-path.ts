import { accessSync, constants, statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { ConfigError } from "./config-error.js";

/**
 * Checks ACS_DB before anything opens it: its directory exists and is writable (SQLite creates
 * the file and its WAL beside it), and the path is not a directory. Throws ConfigError naming
 * `name` (the keys CLI's --db, else ACS_DB).
 */
export function checkDbPath(path: string, name = "ACS_DB"): void {
  const where = `${name}=${path}`;
  const dir = dirname(resolve(path));
  let dirStat: ReturnType<typeof statSync>;
  try {
    dirStat = statSync(dir);
  } catch {
    throw new ConfigError(`${where}: the directory ${dir} does not exist`);
  }
  if (!dirStat.isDirectory()) throw new ConfigError(`${where}: ${dir} is not a directory`);
  try {
    accessSync(dir, constants.W_OK);
  } catch {
    throw new ConfigError(`${where}: the directory ${dir} is not writable`);
  }
  try {
    if (statSync(path).isDirectory()) throw new ConfigError(`${where}: is a directory, not a file`);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    // A missing file is fine: it is created.
  }
}
