/**
 * Soak section `json`: the strict JSON decoder's fast-check property
 * (test/helpers/strict-json-property.ts) at 100,000 cases — documents with long digit runs, deep
 * nesting and big arrays, corrupted bodies, number fields — against exact references.
 * `SOAK_JSON_RUNS` changes the count; `SOAK_SEED` replays a seed.
 */
import fc from "fast-check";
import { strictJsonProperty } from "../test/helpers/strict-json-property.js";
import type { SoakResult } from "./soak-heap.js";

export async function soakJson(): Promise<SoakResult> {
  const runs = Number(process.env.SOAK_JSON_RUNS ?? 100_000);
  const seed =
    process.env.SOAK_SEED === undefined
      ? Date.now() ^ (Math.random() * 2 ** 31)
      : Number(process.env.SOAK_SEED);
  console.error(`  json: seed ${seed}, ${runs} cases`);
  const started = performance.now();
  let executions = 0;
  const counted = strictJsonProperty.beforeEach((previous) => {
    executions++;
    if (executions % 10_000 === 0) {
      console.error(`  json: ${executions} cases, ${((performance.now() - started) / 1000).toFixed(0)} s`);
    }
    return previous();
  });
  const details = await fc.check(counted, { numRuns: runs, seed, endOnFailure: true });
  const seconds = (performance.now() - started) / 1000;
  const ok = !details.failed && details.numRuns === runs;
  const lines = [
    "## json: the strict JSON decoder against exact references",
    "",
    "The fast-check property of test/helpers/strict-json-property.ts (the suite runs 400 cases): " +
      "documents with digit runs up to 2,000 long, exponents far beyond a double, arrays of up to " +
      "3,000 numbers, nesting within two levels of the 512 limit, escapes, repeated and prototype keys; " +
      "bodies cut or corrupted anywhere (against JSON.parse); number fields of a request (against " +
      "BigInt arithmetic). Every case is also parsed in slices and must agree.",
    "",
    "| seed | cases run | failures | seconds | ms per case |",
    "|---:|---:|---:|---:|---:|",
    `| ${seed} | ${details.numRuns} of ${runs} | ${details.failed ? 1 : 0} | ${seconds.toFixed(1)} | ${((seconds * 1000) / Math.max(1, executions)).toFixed(2)} |`,
    "",
  ];
  if (details.failed) {
    lines.push(`FAIL: ${String(details.errorInstance).slice(0, 2000)}`);
    // JSON.stringify, not fc.stringify: a counterexample may nest 600 levels deep.
    lines.push("", `Counterexample: \`${JSON.stringify(details.counterexample)?.slice(0, 2000)}\``);
    lines.push(
      "",
      `Replay: \`SOAK_SEED=${seed} npm run soak -- json\` (path ${details.counterexamplePath}).`,
    );
  } else {
    lines.push(`${ok ? "PASS" : "FAIL"}: ${details.numRuns} cases, no disagreement.`);
  }
  return { text: lines.join("\n"), ok };
}
