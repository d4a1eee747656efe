// Defaults resolved once: a configurable setting's default lives in the env schema
// (src/config/env-schema.ts, read by loadConfig) and nowhere below it. Code outside src/config
// takes resolved settings: it neither reads the contract's limits that stand as a variable's
// default (`?? limits.streamStallMs`, or any other read of them, which bypasses the variable) nor
// falls back from a setting to a value of its own (`options.stallMs ?? 60_000`). A text scan of
// src/ (but src/config, and src/engine and src/playground, which import nothing of src/).
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";
import { limits } from "../../src/config/index.js";
import { configDefaults } from "../helpers/config-defaults.js";

const root = new URL("../../", import.meta.url).pathname;
const exempt = [/^src\/config\//, /^src\/engine\//, /^src\/playground\//];

/**
 * What the settings are called below the configuration where the name differs from Config's
 * (an option of a constructor): a fallback on one of these is a default restated too.
 */
const optionNames = [
  "stallMs",
  "holdRenewIntervalMs",
  "renewEveryMs",
  "fanOutConcurrency",
  "silenceTimeoutMs",
  "requestBytes",
  "processBytes",
];

/**
 * The settings that have a default: Config's fields that an empty environment sets to a number or
 * a string. Those left unset (`instanceId`: a name generated per run; `playgroundDir`: the
 * package's own dist/playground; `db`, `opsPort`…) mean something else than a value, and are not
 * defaults restated.
 */
const defaulted = Object.entries(configDefaults)
  .filter(([, value]) => typeof value === "number" || typeof value === "string")
  .map(([name]) => name);

/** The gateway's source files a default must not be restated in, as [path from the root, text]. */
function sources(dir = join(root, "src")): Array<[string, string]> {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry): Array<[string, string]> => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    const rel = relative(root, path);
    if (!entry.name.endsWith(".ts") || exempt.some((pattern) => pattern.test(rel))) return [];
    return [[rel, readFileSync(path, "utf8")]];
  });
}

/** The names `text` binds src/config's `limits` to (`limits`, or its alias), from its imports. */
function limitsBindings(text: string): string[] {
  const imports = text.matchAll(/import\s*(?:type\s*)?\{([^}]*)\}\s*from\s*"[^"]*\/config\/index\.js"/g);
  return [...imports].flatMap(([, names = ""]) =>
    names
      .split(",")
      .map((name) => /^\s*limits(?:\s+as\s+(\w+))?\s*$/.exec(name))
      .flatMap((match) => (match ? [match[1] ?? "limits"] : [])),
  );
}

/** The keys of `limits` that stand as a variable's default: Config holds them under the same name. */
const configurableLimits = Object.keys(limits).filter(
  (key) => (configDefaults as unknown as Record<string, unknown>)[key] === limits[key as keyof typeof limits],
);

describe("defaults resolved once (the env schema)", () => {
  it("finds the limits that are a variable's default and the settings with one (the scans are not vacuous)", () => {
    expect(defaulted).toEqual(
      expect.arrayContaining(["holdRenewMs", "leaseTtlMs", "upstreamHeadersTimeoutMs"]),
    );
    expect(configurableLimits).toEqual(
      expect.arrayContaining([
        "keepaliveIntervalMs",
        "streamStallMs",
        "steeringRequestBytes",
        "lensFanOutConcurrency",
      ]),
    );
  });

  it("no code below src/config reads a limit that a variable sets: it takes the setting", () => {
    const reads = sources().flatMap(([path, text]) =>
      limitsBindings(text).flatMap((name) =>
        [...text.matchAll(new RegExp(`\\b${name}\\.(${configurableLimits.join("|")})\\b`, "g"))].map(
          (match) => `${path}: ${match[0]}`,
        ),
      ),
    );
    expect(reads).toEqual([]);
  });

  it("no code below src/config falls back from a setting to a default of its own (`setting ?? …`)", () => {
    const pattern = new RegExp(`\\.(${[...defaulted, ...optionNames].join("|")})\\s*\\?\\?`, "g");
    const fallbacks = sources().flatMap(([path, text]) =>
      [...text.matchAll(pattern)].map((match) => `${path}: ${match[0]}`),
    );
    expect(fallbacks).toEqual([]);
  });
});
