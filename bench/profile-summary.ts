/**
 * Summarises a V8 CPU profile (`node --cpu-prof` writes `*.cpuprofile`): self time grouped by where
 * the code lives — node internals, each node_modules package, each folder of src/ — and the
 * functions with the most self time. Samples can be limited to a window of the monotonic clock (the
 * profile's own clock: `process.hrtime` in µs, the same in every process of the machine), so that
 * start-up and shutdown stay out of a profile taken under load.
 *
 * CLI: `npx tsx bench/profile-summary.ts FILE.cpuprofile [--root DIR] [--top 15] [--from-us N]
 * [--to-us N] [--no-line-numbers]` prints the two markdown tables.
 *
 * Samples are wall-clock: a thread blocked in a system call (an fsync) or waiting for a CPU counts
 * where it stands.
 */
import { readFileSync } from "node:fs";
import { relative, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

/** The parts of the `.cpuprofile` JSON (Chrome DevTools' Profiler.Profile) read here. */
export interface CpuProfile {
  nodes: Array<{
    id: number;
    callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  }>;
  /** µs, monotonic clock. */
  startTime: number;
  endTime: number;
  /** Node id of each sample. */
  samples?: number[];
  /** µs from the previous sample (the first: from startTime). */
  timeDeltas?: number[];
}

export interface SummaryRow {
  label: string;
  selfMs: number;
  /** Of the busy (non-idle) time in the window, 0–1. */
  share: number;
}

export interface ProfileSummary {
  /** Length of the window the samples were taken from, ms. */
  windowMs: number;
  /** Samples of `(idle)`, ms. */
  idleMs: number;
  /** Every other sample, ms. */
  busyMs: number;
  /** Self time by group, largest first. */
  groups: SummaryRow[];
  /** Self time by function (`name (place:line)`, group), largest first, `top` of them. */
  functions: Array<SummaryRow & { group: string }>;
}

/**
 * The group of a call frame: `(idle)`, `(garbage collector)`, `(program)`, `native (builtins,
 * bindings)` (frames without a script: V8 builtins such as JSON.parse, Node's C++ bindings such as a
 * socket's writev), `node internals` (`node:` URLs), `wasm (…)` (WebAssembly, e.g. undici's HTTP
 * parser), `<package>` for node_modules
 * (the innermost one; scoped names kept), `src/<folder>` (or `src/<file>`; `src/surfaces/<surface>`) under `root`, `gen`, any
 * other folder of `root` by its first two path segments, `dist/…` likewise, else the URL itself.
 */
export function groupOf(functionName: string, url: string, root: string): string {
  if (url === "") {
    if (functionName === "(idle)" || functionName === "(garbage collector)" || functionName === "(program)")
      return functionName;
    if (functionName === "(root)") return "(root)";
    return "native (builtins, bindings)";
  }
  if (url.startsWith("node:")) return "node internals";
  if (url.startsWith("wasm:")) return "wasm (e.g. undici's llhttp)";
  let path = url;
  if (url.startsWith("file://")) {
    try {
      path = fileURLToPath(url);
    } catch {
      return url;
    }
  }
  const nm = path.lastIndexOf(`${sep}node_modules${sep}`);
  if (nm >= 0) {
    const parts = path.slice(nm + 14).split(sep);
    return parts[0]?.startsWith("@") ? `${parts[0]}/${parts[1]}` : (parts[0] as string);
  }
  const rel = relative(root, path);
  if (rel.startsWith("..") || rel === path) return path;
  const parts = rel.split(sep);
  const prefix = parts[0] === "dist" ? `dist/` : "";
  const rest = parts[0] === "dist" ? parts.slice(1) : parts;
  // src/surfaces holds only the surfaces' folders: each of them is a group (src/surfaces/rest…).
  const depth = rest[0] === "src" && rest[1] === "surfaces" ? 3 : 2;
  if (rest.length <= depth) return prefix + rest.join("/");
  return prefix + rest.slice(0, depth).join("/");
}

/** Self time per node id within [fromUs, toUs] (sample start times), µs. */
function selfTimes(profile: CpuProfile, fromUs: number, toUs: number): Map<number, number> {
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  const self = new Map<number, number>();
  let t = profile.startTime;
  const times = samples.map((_, i) => {
    t += deltas[i] ?? 0;
    return t;
  });
  for (let i = 0; i < samples.length; i++) {
    const start = times[i] as number;
    if (start < fromUs || start >= toUs) continue;
    const end = i + 1 < samples.length ? (times[i + 1] as number) : profile.endTime;
    const id = samples[i] as number;
    self.set(id, (self.get(id) ?? 0) + Math.max(0, end - start));
  }
  return self;
}

/**
 * Summarises `profile`: groups (see {@link groupOf}) and the `top` functions by self time, over
 * the samples taken in [fromUs, toUs) (default: the whole profile). Functions are named with their
 * file and line; `lineNumbers: false` leaves the line out (and merges same-named functions of a
 * file), for code whose lines are not the source's: tsx's output is mostly one line.
 */
export function summariseProfile(
  profile: CpuProfile,
  opts: { root: string; fromUs?: number; toUs?: number; top?: number; lineNumbers?: boolean },
): ProfileSummary {
  const fromUs = Math.max(opts.fromUs ?? profile.startTime, profile.startTime);
  const toUs = Math.min(opts.toUs ?? profile.endTime, profile.endTime);
  const self = selfTimes(profile, fromUs, toUs);
  const groups = new Map<string, number>();
  const functions = new Map<string, { group: string; us: number }>();
  let idleUs = 0;
  let busyUs = 0;
  for (const node of profile.nodes) {
    const us = self.get(node.id);
    if (us === undefined || us === 0) continue;
    const { functionName, url, lineNumber } = node.callFrame;
    const group = groupOf(functionName, url, opts.root);
    if (group === "(idle)") {
      idleUs += us;
      continue;
    }
    busyUs += us;
    groups.set(group, (groups.get(group) ?? 0) + us);
    const line = opts.lineNumbers === false ? "" : `:${lineNumber + 1}`;
    const place = url === "" ? "" : ` (${shortPlace(url, opts.root)}${line})`;
    const key = `${functionName || "(anonymous)"}${place}`;
    const f = functions.get(key) ?? { group, us: 0 };
    f.us += us;
    functions.set(key, f);
  }
  const share = (us: number) => (busyUs === 0 ? 0 : us / busyUs);
  return {
    windowMs: (toUs - fromUs) / 1000,
    idleMs: idleUs / 1000,
    busyMs: busyUs / 1000,
    groups: [...groups]
      .sort((a, b) => b[1] - a[1])
      .map(([label, us]) => ({ label, selfMs: us / 1000, share: share(us) })),
    functions: [...functions]
      .sort((a, b) => b[1].us - a[1].us)
      .slice(0, opts.top ?? 15)
      .map(([label, f]) => ({ label, group: f.group, selfMs: f.us / 1000, share: share(f.us) })),
  };
}

function shortPlace(url: string, root: string): string {
  if (!url.startsWith("file://")) return url;
  const path = fileURLToPath(url);
  const nm = path.lastIndexOf(`${sep}node_modules${sep}`);
  if (nm >= 0)
    return path
      .slice(nm + 14)
      .split(sep)
      .join("/");
  const rel = relative(root, path);
  return rel.startsWith("..") ? path : rel.split(sep).join("/");
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
const ms = (x: number) => x.toFixed(0);

/** Markdown: the group table (the first `maxGroups` groups, the rest summed) and the function table. */
export function summaryMarkdown(s: ProfileSummary, maxGroups = 15): string {
  const shown = s.groups.slice(0, maxGroups);
  const rest = s.groups.slice(maxGroups);
  const lines = [
    `Window ${ms(s.windowMs)} ms: busy ${ms(s.busyMs)} ms, idle ${ms(s.idleMs)} ms. Shares are of the busy time.`,
    "",
    "| self time in | ms | share |",
    "|---|---:|---:|",
    ...shown.map((g) => `| ${g.label} | ${ms(g.selfMs)} | ${pct(g.share)} |`),
  ];
  if (rest.length > 0) {
    const restMs = rest.reduce((a, g) => a + g.selfMs, 0);
    lines.push(`| ${rest.length} other groups | ${ms(restMs)} | ${pct(restMs / Math.max(s.busyMs, 1e-9))} |`);
  }
  lines.push(
    "",
    "| function (self time) | group | ms | share |",
    "|---|---|---:|---:|",
    ...s.functions.map(
      (f) => `| \`${f.label.replaceAll("|", "\\|")}\` | ${f.group} | ${ms(f.selfMs)} | ${pct(f.share)} |`,
    ),
  );
  return lines.join("\n");
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      root: { type: "string", default: process.cwd() },
      top: { type: "string", default: "15" },
      "from-us": { type: "string" },
      "to-us": { type: "string" },
      "no-line-numbers": { type: "boolean", default: false },
    },
  });
  const file = positionals[0];
  if (file === undefined) {
    console.error(
      "usage: tsx bench/profile-summary.ts FILE.cpuprofile [--root DIR] [--top N] [--from-us N] [--to-us N] [--no-line-numbers]",
    );
    process.exit(2);
  }
  const profile = JSON.parse(readFileSync(file, "utf8")) as CpuProfile;
  const summary = summariseProfile(profile, {
    root: values.root,
    top: Number(values.top),
    lineNumbers: !values["no-line-numbers"],
    ...(values["from-us"] === undefined ? {} : { fromUs: Number(values["from-us"]) }),
    ...(values["to-us"] === undefined ? {} : { toUs: Number(values["to-us"]) }),
  });
  console.log(summaryMarkdown(summary));
}
