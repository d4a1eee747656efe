/**
 * `npm run bench`: every benchmark section, printed and appended to bench/RESULTS.md as one new
 * dated section (its headings one level down), after the runs and sessions recorded before it,
 * which it keeps. `npm run bench -- gateway lens` runs only the named sections and prints them
 * (RESULTS.md is written by a full run only: all sections, no options). Options after the names go to the
 * sections that take them, e.g. `npm run bench -- hotpath --quick` (see bench/hotpath/hotpath.ts).
 * `npm run bench -- streams` runs 10,000 concurrent streams (bench/streams/streams.ts; smaller
 * counts through its BENCH_STREAMS* environment variables). `npm run bench -- ab --a CMD --b CMD`
 * compares two builds of the gateway (bench/hotpath/ab.ts); a full run leaves it out. `npm run
 * bench -- surfaces` puts a stream's cost on REST, Connect and gRPC side by side
 * (bench/hotpath/surfaces.ts).
 */
import { appendFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { parseArgs } from "node:util";
import { benchBudget } from "./budget.js";
import { benchEngine } from "./engine.js";
import { benchCapture, benchGateway, benchHoldOnRequest } from "./gateway.js";
import { benchAb } from "./hotpath/ab.js";
import { benchHotpath, type SectionOptions } from "./hotpath/hotpath.js";
import { benchSurfaces } from "./hotpath/surfaces.js";
import { benchLens } from "./lens.js";
import { benchParseStall } from "./parse-stall.js";
import { benchStreams } from "./streams/streams.js";
import { benchStrictJson } from "./strict-json.js";

const sections: Record<string, (options: SectionOptions) => Promise<string>> = {
  engine: benchEngine,
  gateway: benchGateway,
  capture: benchCapture,
  hold: benchHoldOnRequest,
  lens: benchLens,
  "strict-json": benchStrictJson,
  "parse-stall": benchParseStall,
  budget: benchBudget,
  hotpath: benchHotpath,
  streams: benchStreams,
  surfaces: benchSurfaces,
  ab: benchAb,
};
/** Sections a full run (no names) leaves out: they need options. */
const onRequestOnly = new Set(["ab"]);

let parsed: ReturnType<typeof parse>;
function parse() {
  return parseArgs({
    allowPositionals: true,
    options: {
      // hotpath
      quick: { type: "boolean" },
      duration: { type: "string" },
      warmup: { type: "string" },
      prime: { type: "string" },
      rounds: { type: "string" },
      connections: { type: "string" },
      chunks: { type: "string" },
      "hop-ms": { type: "string" },
      "profile-s": { type: "string" },
      "skip-profile": { type: "boolean" },
      "skip-layers": { type: "boolean" },
      "gateway-cmd": { type: "string" },
      // ab (and --duration, --rounds, --connections, --chunks above)
      a: { type: "string" },
      b: { type: "string" },
      mode: { type: "string" },
      keys: { type: "string" },
    },
  });
}
try {
  parsed = parse();
} catch (err) {
  console.error(`bench: ${(err as Error).message}`);
  process.exit(2);
}
const unknown = parsed.positionals.filter((a) => !(a in sections));
if (unknown.length > 0) {
  console.error(
    `unknown bench section(s): ${unknown.join(", ")}; known: ${Object.keys(sections).join(", ")}`,
  );
  process.exit(2);
}
const wanted = parsed.positionals;
const options: SectionOptions = parsed.values;
const names = wanted.length > 0 ? wanted : Object.keys(sections).filter((n) => !onRequestOnly.has(n));
const out: string[] = [
  `## Full run (\`npm run bench\`) — ${new Date().toISOString()}`,
  "",
  `${cpus().length} × ${cpus()[0]?.model ?? "?"}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}. Figures from one run; the machine is shared, so read ratios and medians, not absolutes.`,
  "",
];
for (const name of names) {
  console.error(`bench: ${name}…`);
  const section = await (sections[name] as (o: SectionOptions) => Promise<string>)(options);
  out.push(demoteHeadings(section), "");
  console.log(section, "\n");
}
if (wanted.length === 0 && Object.keys(options).length === 0) {
  appendFileSync(new URL("./RESULTS.md", import.meta.url), `\n${out.join("\n")}`);
  console.error("bench: appended to bench/RESULTS.md");
}

/** A section's markdown headings one level down (`## X` → `### X`), under the run's own heading. */
function demoteHeadings(markdown: string): string {
  return markdown.replace(/^(#{1,5}) /gm, "#$1 ");
}
