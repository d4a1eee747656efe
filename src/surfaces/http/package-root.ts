// The package this module belongs to: the folder above src/ (tsx) or dist/src/ (compiled) that
// holds package.json, and the version that package.json gives (GET /version).
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The nearest folder above this module holding package.json; the working directory if none. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "package.json"))) return dir;
    const parent = dirname(dir);
    if (parent === dir) return process.cwd();
    dir = parent;
  }
}

let version: string | undefined;

/** The gateway's version: `version` of its package.json (read once). */
export function packageVersion(): string {
  if (version === undefined) {
    const json = JSON.parse(readFileSync(join(packageRoot(), "package.json"), "utf8")) as {
      version?: unknown;
    };
    version = typeof json.version === "string" ? json.version : "unknown";
  }
  return version;
}
