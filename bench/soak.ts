/**
 * `npm run soak`: long-running checks of the real gateway in a child process, each a section that
 * prints its figures (markdown) and passes or fails; the exit code is 1 when any section fails.
 * `npm run soak -- heap` runs only the named sections. `json` runs in this process: the strict JSON
 * decoder's property, 100,000 cases.
 */
import { type SoakResult, soakHeap } from "./soak-heap.js";
import { soakJson } from "./soak-json.js";
import { soakSteering } from "./soak-steering.js";

const sections: Record<string, () => Promise<SoakResult>> = {
  heap: soakHeap,
  steering: soakSteering,
  json: soakJson,
};

const args = process.argv.slice(2);
const unknown = args.filter((a) => !(a in sections));
if (unknown.length > 0) {
  console.error(`unknown soak section(s): ${unknown.join(", ")}; known: ${Object.keys(sections).join(", ")}`);
  process.exit(2);
}
const names = args.length > 0 ? args : Object.keys(sections);
let failed = 0;
console.log(`# Soak results\n\nNode ${process.version}.\n`);
for (const name of names) {
  console.error(`soak: ${name}…`);
  const result = await (sections[name] as () => Promise<SoakResult>)();
  console.log(result.text, "\n");
  if (!result.ok) failed++;
}
if (failed > 0) {
  console.error(`soak: ${failed} section(s) failed`);
  process.exit(1);
}
