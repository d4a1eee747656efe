// The gateway's layers: every src/**/*.ts file's imports, read as text, point one way down the
// order below, and no import cycle exists among the files.
//
// Imports are found by TypeScript's scanner (`ts.preProcessFile`: no program, no type check):
// static `import … from "…"`, `export … from "…"`, `import "…"` and `import("…")` with a literal,
// comments and strings skipped. Relative specifiers are resolved to files (`x.js` → `x.ts`, a
// folder → its `index.ts`); packages and files outside src (gen/) are ignored.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { describe, expect, it } from "vitest";

/**
 * THE layer table: moving a folder later means editing this table only.
 *
 * `rank` is the order, lowest first: a file may import its own layer's files and those of a lower
 * rank; layers of the same rank (siblings) must not import each other. `paths` are folders (every
 * file under them) or single files, relative to the repository root.
 *
 * A layer with `program` is a separate program (not part of the gateway's order): its files import
 * only their own layer's files, and only the layers in `importedBy` may import them.
 */
const LAYERS: readonly Layer[] = [
  { name: "core", rank: 0, paths: ["src/core"] },
  { name: "config", rank: 1, paths: ["src/config"] },
  // Pure tensor and vllm-lens codecs: below upstream, whose translator (upstream/vllm/translate.ts)
  // writes steering vectors and reads captures with them.
  { name: "lens", rank: 2, paths: ["src/lens"] },
  { name: "budget", rank: 3, paths: ["src/budget"] },
  { name: "upstream", rank: 3, paths: ["src/upstream"] },
  { name: "telemetry", rank: 3, paths: ["src/telemetry"] },
  // Requests and tokens per minute per scope (issue 35), in memory or Redis: core and config only.
  { name: "ratelimit", rank: 3, paths: ["src/ratelimit"] },
  { name: "service", rank: 4, paths: ["src/service"] },
  // The two API surfaces, siblings: what they share is in core (the strict JSON parser, the
  // shutdown link) or the service.
  { name: "rest", rank: 5, paths: ["src/surfaces/rest"] },
  { name: "rpc", rank: 5, paths: ["src/surfaces/rpc"] },
  // The one HTTP server both surfaces are served on: its routes, error handlers, ops port, metrics.
  { name: "http", rank: 6, paths: ["src/surfaces/http"] },
  // The one wiring: config to a running app, the cluster, the embedded engine, the drain.
  { name: "app", rank: 7, paths: ["src/app"] },
  { name: "main", rank: 8, paths: ["src/main.ts"] },
  // The reference engine, started by main.ts as a child process (`import("./engine/index.js")`).
  { name: "engine", program: true, importedBy: ["main"], paths: ["src/engine"] },
  // The browser bundle (vite), served as static files by src/surfaces/http.
  { name: "playground", program: true, importedBy: [], paths: ["src/playground"] },
];

type Layer =
  | { name: string; rank: number; paths: readonly string[]; program?: undefined }
  | { name: string; program: true; importedBy: readonly string[]; paths: readonly string[] };

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const posix = (p: string) => p.split(sep).join("/");

function listTs(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(join(root, dir))) {
    const p = `${dir}/${name}`;
    if (statSync(join(root, p)).isDirectory()) out.push(...listTs(p));
    else if (name.endsWith(".ts") && !name.endsWith(".d.ts")) out.push(p);
  }
  return out.sort();
}

const files = listTs("src");
const fileSet = new Set(files);

/** The layer holding `file` (the longest matching path), or undefined. */
function layerOf(file: string): Layer | undefined {
  let best: { layer: Layer; length: number } | undefined;
  for (const layer of LAYERS) {
    for (const p of layer.paths) {
      if ((file === p || file.startsWith(`${p}/`)) && p.length > (best?.length ?? -1)) {
        best = { layer, length: p.length };
      }
    }
  }
  return best?.layer;
}

interface Edge {
  from: string;
  /** As written in the source. */
  specifier: string;
  /** Resolved file under src. */
  to: string;
}

/** Resolves a relative specifier from `from` to a file under src; undefined: outside src (gen/…). */
function resolveSpecifier(from: string, specifier: string): string | undefined | null {
  const base = posix(relative(root, join(root, dirname(from), specifier)));
  if (!base.startsWith("src/")) return undefined;
  const candidates = [base, base.replace(/\.js$/, ".ts"), `${base}.ts`, `${base}/index.ts`];
  const hit = candidates.find((c) => fileSet.has(c));
  if (hit !== undefined) return hit;
  // A non-TS file (JSON, CSS, HTML) that exists is no edge of the graph; anything else is unresolved.
  return existsSync(join(root, base)) && !statSync(join(root, base)).isDirectory() ? undefined : null;
}

const unresolved: string[] = [];
const edges: Edge[] = [];
for (const from of files) {
  const text = readFileSync(join(root, from), "utf8");
  const { importedFiles } = ts.preProcessFile(text, true, true);
  for (const { fileName: specifier } of importedFiles) {
    if (!specifier.startsWith(".")) continue; // a package (node:…, fastify, @bufbuild/…)
    const to = resolveSpecifier(from, specifier);
    if (to === null) unresolved.push(`${from}: "${specifier}"`);
    else if (to !== undefined) edges.push({ from, specifier, to });
  }
}

const graph = new Map<string, string[]>(files.map((f) => [f, []]));
for (const e of edges) {
  const next = graph.get(e.from)!;
  if (!next.includes(e.to)) next.push(e.to);
}

/** Strongly connected components with more than one file (or a file importing itself): Tarjan. */
function cycles(): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  let n = 0;
  const visit = (v: string) => {
    index.set(v, n);
    low.set(v, n);
    n++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v)!) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1 || graph.get(v)!.includes(v)) out.push(component.sort());
    }
  };
  for (const f of files) if (!index.has(f)) visit(f);
  return out;
}

/** One cycle through `component`'s files, as a path that ends where it starts. */
function cyclePath(component: string[]): string[] {
  const inside = new Set(component);
  const start = component[0]!;
  // Breadth-first from start's successors back to start, inside the component.
  const previous = new Map<string, string>();
  const queue = graph.get(start)!.filter((w) => inside.has(w));
  for (const w of queue) previous.set(w, start);
  while (queue.length > 0) {
    const v = queue.shift()!;
    if (v === start) break;
    for (const w of graph.get(v)!) {
      if (inside.has(w) && !previous.has(w)) {
        previous.set(w, v);
        queue.push(w);
      }
    }
  }
  const path = [start];
  for (let v = previous.get(start)!; v !== start; v = previous.get(v)!) path.unshift(v);
  path.unshift(start);
  return path;
}

/** Why `edge` breaks the layer order, or undefined when it is allowed. */
function violation(edge: Edge): string | undefined {
  const a = layerOf(edge.from)!;
  const b = layerOf(edge.to)!;
  if (a === b) return undefined;
  const where = `${edge.from} imports "${edge.specifier}" (${edge.to}):`;
  if (b.program) {
    return a.program || !b.importedBy.includes(a.name)
      ? `${where} layer ${a.name} → ${b.name}, a separate program only ${b.importedBy.join(", ") || "nothing"} may import`
      : undefined;
  }
  if (a.program) return `${where} layer ${a.name} (a separate program) → ${b.name}, a gateway layer`;
  if (b.rank === a.rank) return `${where} layer ${a.name} → ${b.name}, its sibling (both rank ${a.rank})`;
  if (b.rank > a.rank) {
    return `${where} layer ${a.name} (rank ${a.rank}) → ${b.name} (rank ${b.rank}), a layer above it`;
  }
  return undefined;
}

describe("layers (src/**/*.ts imports)", () => {
  it("reads imports from the files (the scan is not empty)", () => {
    expect(files.length).toBeGreaterThan(50);
    expect(edges.length).toBeGreaterThan(100);
    expect(unresolved, "relative imports that resolve to no file").toEqual([]);
  });

  it("maps every file to one layer of the table", () => {
    expect(files.filter((f) => layerOf(f) === undefined)).toEqual([]);
  });

  it("has no import cycle among files", () => {
    const found = cycles().map((c) => `cycle: ${cyclePath(c).join(" → ")}`);
    expect(found, found.join("\n")).toEqual([]);
  });

  it("imports point one way down the layer order", () => {
    const found = edges.map(violation).filter((v) => v !== undefined);
    expect(found, found.join("\n")).toEqual([]);
  });

  // Noted, not enforced: a file importing another folder's file rather than the folder's index.ts.
  it("notes deep imports past another folder's index.ts", () => {
    const deep = edges.filter((e) => {
      const folder = dirname(e.to);
      return (
        dirname(e.from) !== folder &&
        !e.from.startsWith(`${folder}/`) &&
        !e.to.endsWith("/index.ts") &&
        fileSet.has(`${folder}/index.ts`)
      );
    });
    if (deep.length > 0) {
      console.info(
        `${deep.length} deep imports (not enforced):\n${deep.map((e) => `  ${e.from} → ${e.to}`).join("\n")}`,
      );
    }
    expect(deep.every((e) => fileSet.has(e.to))).toBe(true);
  });
});
