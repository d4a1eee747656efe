/**
 * `npm run bench`: every benchmark section, printed and written to bench/RESULTS.md, where each
 * bench keeps one section (`<!-- bench: NAME -->`, bench/results-file.ts): a run replaces the
 * sections of the benches it ran and keeps the others; history is in git. `npm run bench --
 * gateway lens` runs and writes only the named sections. A run with options writes nothing (its
 * figures are not the bench's own). Options after the names go to the
 * sections that take them, e.g. `npm run bench -- hotpath --quick` (see bench/hotpath/hotpath.ts).
 * `npm run bench -- streams` runs 10,000 concurrent streams (bench/streams/streams.ts; smaller
 * counts through its BENCH_STREAMS* environment variables). `npm run bench -- ab --a CMD --b CMD`
 * compares two builds of the gateway (bench/hotpath/ab.ts); a full run leaves it out. `npm run
 * bench -- surfaces` puts a stream's cost on REST, Connect and gRPC side by side
 * (bench/hotpath/surfaces.ts).
 */
import { readFileSync, writeFileSync } from "node:fs";
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
import { withSection } from "./results-file.js";
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
const machine = `${cpus().length} × ${cpus()[0]?.model ?? "?"}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}`;
const resultsUrl = new URL("./RESULTS.md", import.meta.url);
const write = Object.keys(options).length === 0;
for (const name of names) {
  console.error(`bench: ${name}…`);
  const section = await (sections[name] as (o: SectionOptions) => Promise<string>)(options);
  console.log(section, "\n");
  if (!write) continue;
  const stamped = `${section.trimEnd()}\n\n_\`npm run bench -- ${name}\`, ${new Date().toISOString()}, ${machine}. One run on a shared machine: read ratios and medians, not absolutes._\n`;
  writeFileSync(resultsUrl, withSection(readFileSync(resultsUrl, "utf8"), name, stamped));
  console.error(`bench: ${name} written to bench/RESULTS.md`);
}
