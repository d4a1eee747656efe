// Units of code stay readable at once: outside src/engine/ (a separate program), src/playground/
// (a browser bundle) and the strict JSON parser, no file in src/ is over 400 lines and no function
// over 80 (function declarations, methods, accessors, constructors, function expressions and
// arrow functions, measured by TypeScript's own parser, from the first line of the function to its
// last, nested functions included). The ones that are still over are listed in `stillOver` with
// their size today: an offender not on the list, or one that grew, fails and is named; an entry
// that is no longer over fails too, so the list only shrinks.
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import ts from "typescript";
import { describe, expect, it } from "vitest";

const MAX_FILE_LINES = 400;
const MAX_FUNCTION_LINES = 80;
const root = new URL("../../", import.meta.url).pathname;
const src = join(root, "src");
const exempt = [/^src\/engine\//, /^src\/playground\//, /^src\/core\/json\/strict-json\.ts$/];

/**
 * What is still over a bound (`file` → its lines, `file#function` → the function's lines), to be
 * split; each entry is at most its size here. Remove an entry once its unit is within the bound.
 */
const stillOver: Readonly<Record<string, number>> = {};

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(path);
    return entry.name.endsWith(".ts") ? [path] : [];
  });
}

/** A function-like node's name as a reader finds it: its own, its variable's or property's, else its line. */
function functionName(node: ts.Node, file: ts.SourceFile): string {
  const named = node as ts.Node & { name?: ts.Node };
  if (named.name !== undefined) return named.name.getText(file);
  if (ts.isConstructorDeclaration(node))
    return `${(node.parent as ts.ClassDeclaration).name?.getText(file) ?? "class"}.constructor`;
  const parent = node.parent;
  if (
    ts.isVariableDeclaration(parent) ||
    ts.isPropertyAssignment(parent) ||
    ts.isPropertyDeclaration(parent)
  ) {
    return parent.name.getText(file);
  }
  return `(function at line ${file.getLineAndCharacterOfPosition(node.getStart(file)).line + 1})`;
}

/** Every unit over its bound in src/, as `key → lines`. */
function measure(): Map<string, number> {
  const over = new Map<string, number>();
  for (const path of sourceFiles(src)) {
    const rel = relative(root, path);
    if (exempt.some((pattern) => pattern.test(rel))) continue;
    const text = readFileSync(path, "utf8");
    const lines = text.split("\n").length - (text.endsWith("\n") ? 1 : 0);
    if (lines > MAX_FILE_LINES) over.set(rel, lines);
    const file = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true);
    const visit = (node: ts.Node): void => {
      if (ts.isFunctionLike(node) && "body" in node && node.body !== undefined) {
        const first = file.getLineAndCharacterOfPosition(node.getStart(file)).line;
        const last = file.getLineAndCharacterOfPosition(node.getEnd()).line;
        const length = last - first + 1;
        if (length > MAX_FUNCTION_LINES) over.set(`${rel}#${functionName(node, file)}`, length);
      }
      ts.forEachChild(node, visit);
    };
    visit(file);
  }
  return over;
}

describe("sizes of files and functions in src/", () => {
  const over = measure();

  it(`no file over ${MAX_FILE_LINES} lines and no function over ${MAX_FUNCTION_LINES}, but those still listed, none grown`, () => {
    const offenders = [...over]
      .filter(([key, lines]) => stillOver[key] === undefined || lines > (stillOver[key] as number))
      .map(
        ([key, lines]) =>
          `${key}: ${lines} lines${stillOver[key] === undefined ? "" : ` (listed at ${stillOver[key]})`}`,
      );
    expect(offenders).toEqual([]);
  });

  it("lists only what is still over (a unit split is taken off the list)", () => {
    const stale = Object.keys(stillOver).filter((key) => !over.has(key));
    expect(stale).toEqual([]);
  });
});
