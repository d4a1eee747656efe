// The variable table of src/OPERATIONS.md ("Configuration (environment)") against the schema the
// gateway reads its environment with (src/config/env-schema.ts): every variable the schema reads has
// its row, and every row names a variable the schema reads — names exact, one per row.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { envSchema } from "../../src/config/env-schema.js";

const operationsPath = join(import.meta.dirname, "..", "..", "src", "OPERATIONS.md");
const heading = "## Configuration (environment)";

/** The first column of the first table under `heading`, header and separator left out. */
function tableNames(markdown: string): string[] {
  const at = markdown.indexOf(`\n${heading}\n`);
  if (at < 0) throw new Error(`src/OPERATIONS.md has no heading "${heading}"`);
  const lines = markdown.slice(at + heading.length + 2).split("\n");
  const start = lines.findIndex((line) => line.startsWith("|"));
  const next = lines.findIndex((line) => line.startsWith("#"));
  if (start < 0 || (next >= 0 && next < start)) throw new Error(`no table under "${heading}"`);
  const end = lines.findIndex((line, i) => i > start && !line.startsWith("|"));
  const rows = lines.slice(start + 2, end < 0 ? undefined : end);
  return rows.map((row) => {
    const cell = (row.split("|")[1] ?? "").trim();
    const name = /^`([A-Z][A-Z0-9_]*)`$/.exec(cell)?.[1];
    if (name === undefined) throw new Error(`a row of "${heading}" does not name one variable: ${row}`);
    return name;
  });
}

describe("src/OPERATIONS.md's variable table", () => {
  const names = tableNames(readFileSync(operationsPath, "utf8"));
  const read = Object.keys(envSchema.shape);

  it("is not empty, and names each variable once", () => {
    expect(names.length).toBeGreaterThan(0);
    expect(names.filter((name, i) => names.indexOf(name) !== i)).toEqual([]);
  });

  it("has a row for every variable the schema reads", () => {
    expect(read.filter((name) => !names.includes(name))).toEqual([]);
  });

  it("names only variables the schema reads", () => {
    expect(names.filter((name) => !read.includes(name))).toEqual([]);
  });
});
