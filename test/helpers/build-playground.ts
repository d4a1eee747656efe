// Builds the playground page from the sources (src/playground, with its own vite config) into a
// folder of the test's own, so that a browser test always serves what the sources say, never a
// stale dist/playground.
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "vite";

const configFile = fileURLToPath(new URL("../../src/playground/vite.config.ts", import.meta.url));

/** Runs vite's build of the page into a new temporary folder and returns the folder. */
export async function buildPlayground(): Promise<string> {
  const outDir = await mkdtemp(join(tmpdir(), "acs-playground-"));
  await build({ configFile, logLevel: "warn", build: { outDir, emptyOutDir: true } });
  return outDir;
}
