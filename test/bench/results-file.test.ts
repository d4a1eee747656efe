// bench/RESULTS.md keeps one section per bench: a run replaces its bench's section and keeps the
// others (bench/results-file.ts).
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { withSection } from "../../bench/results-file.js";

const file = [
  "# Benchmark results",
  "",
  "<!-- bench: engine -->",
  "",
  "## Engine",
  "old engine figures",
  "",
  "<!-- bench: hotpath -->",
  "",
  "## Hot path",
  "old hot path figures",
  "",
].join("\n");

describe("withSection", () => {
  it("replaces the named bench's section and keeps every other", () => {
    const next = withSection(file, "engine", "## Engine\nnew engine figures\n");
    expect(next).toContain("new engine figures");
    expect(next).not.toContain("old engine figures");
    expect(next).toContain("## Hot path\nold hot path figures");
    expect(next.indexOf("new engine figures")).toBeLessThan(next.indexOf("## Hot path"));
  });

  it("replaces the last section up to the end of the file", () => {
    const next = withSection(file, "hotpath", "## Hot path\nnew\n");
    expect(next.endsWith("<!-- bench: hotpath -->\n\n## Hot path\nnew\n\n")).toBe(true);
    expect(next).not.toContain("old hot path figures");
  });

  it("appends a bench the file does not have yet", () => {
    const next = withSection(file, "lens", "## Lens\nfigures\n");
    expect(next.startsWith(file.trimEnd())).toBe(true);
    expect(next).toContain("<!-- bench: lens -->\n\n## Lens\nfigures");
  });

  it("a run of the same figures twice leaves the file as once", () => {
    const once = withSection(file, "engine", "## Engine\nx\n");
    expect(withSection(once, "engine", "## Engine\nx\n")).toBe(once);
  });

  it("bench/RESULTS.md has one section per bench", () => {
    const results = readFileSync(new URL("../../bench/RESULTS.md", import.meta.url), "utf8");
    const names = [...results.matchAll(/^<!-- bench: ([a-z0-9-]+) -->$/gm)].map((m) => m[1]);
    expect(names.length).toBeGreaterThan(5);
    expect(new Set(names).size).toBe(names.length);
  });
});
