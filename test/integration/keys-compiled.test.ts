// `npm run keys` as deployed: compiled JavaScript (tsconfig.build.json, as `npm run build` makes
// dist/), in a folder laid out as after `npm prune --omit=dev` as far as the CLI goes: package.json,
// dist/ and node_modules without tsx. A key is created and listed in a temporary SQLite file.
import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "acs-keys-compiled-"));

/** This process's environment without the gateway's and npm's variables, plus `env`. */
function envWith(env: Record<string, string>): NodeJS.ProcessEnv {
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith("ACS_") && !k.startsWith("npm_")),
  );
  return { ...clean, ...env };
}

beforeAll(async () => {
  // The build of `npm run build` (tsc -p tsconfig.build.json), into this folder's dist/ (the
  // checkout's own dist/ is left to the tests that run `npm start`).
  await run(
    process.execPath,
    [
      join(ROOT, "node_modules/typescript/bin/tsc"),
      "-p",
      join(ROOT, "tsconfig.build.json"),
      "--outDir",
      join(dir, "dist"),
      "--tsBuildInfoFile",
      join(dir, "dist/.tsbuildinfo"),
    ],
    { cwd: ROOT },
  );
  copyFileSync(join(ROOT, "package.json"), join(dir, "package.json"));
  // The installed packages, tsx (the dev dependency that ran TypeScript) left out.
  mkdirSync(join(dir, "node_modules"));
  for (const name of readdirSync(join(ROOT, "node_modules"))) {
    if (name === "tsx" || name === ".bin") continue;
    symlinkSync(join(ROOT, "node_modules", name), join(dir, "node_modules", name));
  }
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** `npm run keys -- ARGS` in the deployed folder. */
const keys = (args: readonly string[], db: string) =>
  run("npm", ["run", "--silent", "keys", "--", ...args], { cwd: dir, env: envWith({ ACS_DB: db }) });

describe("npm run keys from compiled JavaScript", () => {
  it("creates a key and lists it, without tsx", async () => {
    const db = join(dir, "keys.db");
    const created = await keys(["create", "--budget", "1000", "--name", "alice", "--json"], db);
    const key = JSON.parse(created.stdout) as { id: string; key: string; budgetTokens: number };
    expect(key.key).toMatch(/^acs-/);
    expect(key.budgetTokens).toBe(1000);
    const listed = await keys(["list", "--json"], db);
    const list = JSON.parse(listed.stdout) as Array<{ id: string; name: string }>;
    expect(list.map((k) => [k.id, k.name])).toEqual([[key.id, "alice"]]);
  });
});
