/**
 * `npm run bench`: every benchmark section, written to bench/RESULTS.md (and printed).
 * `npm run bench -- gateway lens` runs only the named sections.
 */
import { writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { benchBudget } from "./budget.js";
import { benchEngine } from "./engine.js";
import { benchCapture, benchGateway, benchHoldOnRequest } from "./gateway.js";
import { benchLens } from "./lens.js";

const sections: Record<string, () => Promise<string>> = {
  engine: benchEngine,
  gateway: benchGateway,
  capture: benchCapture,
  hold: benchHoldOnRequest,
  lens: benchLens,
  budget: benchBudget,
};

const args = process.argv.slice(2);
const unknown = args.filter((a) => !(a in sections));
if (unknown.length > 0) {
  console.error(
    `unknown bench section(s): ${unknown.join(", ")}; known: ${Object.keys(sections).join(", ")}`,
  );
  process.exit(2);
}
const wanted = args;
const names = wanted.length > 0 ? wanted : Object.keys(sections);
const out: string[] = [
  "# Benchmark results",
  "",
  `Run ${new Date().toISOString()} on ${cpus().length} × ${cpus()[0]?.model ?? "?"}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}. Figures from one run; the machine is shared, so read ratios and medians, not absolutes.`,
  "",
];
for (const name of names) {
  console.error(`bench: ${name}…`);
  const section = await (sections[name] as () => Promise<string>)();
  out.push(section, "");
  console.log(section, "\n");
}
if (wanted.length === 0) writeFileSync(new URL("./RESULTS.md", import.meta.url), out.join("\n"));
