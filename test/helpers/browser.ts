// A real browser for the page tests: Debian's `chromium` (/usr/bin/chromium, or ACS_CHROMIUM)
// driven by playwright-core. Without it the browser tests are skipped with the reason, unless
// ACS_TEST_BROWSER=required (as .ci/run sets it, after installing chromium), which fails them.
import { existsSync } from "node:fs";
import { type Browser, chromium } from "playwright-core";

/** The chromium executable the tests drive. @default /usr/bin/chromium (env ACS_CHROMIUM) */
export const CHROMIUM_PATH = process.env.ACS_CHROMIUM || "/usr/bin/chromium";

/** True when ACS_TEST_BROWSER=required: a missing chromium fails the browser tests instead of skipping them. */
export const BROWSER_REQUIRED = process.env.ACS_TEST_BROWSER === "required";

/**
 * Flags of every launch: headless, no sandbox (CI runs as root), no GPU, and nothing that talks
 * to the network on its own (background networking, component updates, sync, QUIC). Playwright
 * gives each launch a fresh `--user-data-dir` of its own (a new temporary profile, removed on
 * close), so no state survives from one launch to the next.
 */
export const CHROMIUM_FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
];

/** Why the browser tests cannot run here, or undefined when chromium is installed. */
export function chromiumUnavailable(): string | undefined {
  if (existsSync(CHROMIUM_PATH)) return undefined;
  return `no chromium at ${CHROMIUM_PATH} (apt-get install chromium, or set ACS_CHROMIUM)`;
}

/**
 * The browser tests' skip condition: true (skip) when chromium is missing and not required; a
 * missing chromium with ACS_TEST_BROWSER=required is not skipped, so its launch fails the tests.
 */
let skipSaid = false;

export function skipBrowserTests(): boolean {
  const reason = chromiumUnavailable();
  if (reason === undefined) return false;
  if (BROWSER_REQUIRED) return false;
  if (!skipSaid) skipSaid = true;
  else return true;
  process.stderr.write(
    `\n*** ${reason}: the browser tests are SKIPPED (ACS_TEST_BROWSER=required fails instead) ***\n`,
  );
  return true;
}

/** Launches headless chromium with {@link CHROMIUM_FLAGS} and a fresh profile. Close it with `browser.close()`. */
export async function launchChromium(): Promise<Browser> {
  const reason = chromiumUnavailable();
  if (reason !== undefined)
    throw new Error(`${reason}; ACS_TEST_BROWSER=required makes the browser tests mandatory`);
  return chromium.launch({ executablePath: CHROMIUM_PATH, headless: true, args: CHROMIUM_FLAGS });
}
