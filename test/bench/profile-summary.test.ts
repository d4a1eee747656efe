// bench/profile-summary.ts: self time of a V8 CPU profile by group and function, in a time window.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { type CpuProfile, groupOf, summariseProfile, summaryMarkdown } from "../../bench/profile-summary.js";

const root = "/repo";
const file = (p: string) => pathToFileURL(p).href;

describe("groupOf", () => {
  it.each([
    ["(idle)", "", "(idle)"],
    ["(garbage collector)", "", "(garbage collector)"],
    ["(program)", "", "(program)"],
    ["parse", "", "native (builtins, bindings)"],
    ["emit", "node:events", "node internals"],
    ["write", "node:internal/stream_base_commons", "node internals"],
    ["f", file("/repo/node_modules/fastify/lib/route.js"), "fastify"],
    ["f", file("/repo/node_modules/@bufbuild/protobuf/dist/esm/from-binary.js"), "@bufbuild/protobuf"],
    ["f", file("/repo/node_modules/a/node_modules/@x/y/index.js"), "@x/y"],
    ["f", file("/repo/src/upstream/vllm/decode-sse.ts"), "src/upstream"],
    ["f", file("/repo/src/main.ts"), "src/main.ts"],
    ["f", file("/repo/src/surfaces/rest/sse-writer.ts"), "src/surfaces/rest"],
    ["f", file("/repo/src/surfaces/rpc/routes.ts"), "src/surfaces/rpc"],
    ["f", file("/repo/dist/src/surfaces/rest/sse-writer.js"), "dist/src/surfaces/rest"],
    ["f", file("/repo/dist/src/upstream/pool/pool.js"), "dist/src/upstream"],
    ["f", file("/repo/gen/acs/v1/completions_pb.ts"), "gen/acs"],
    ["f", file("/elsewhere/x.js"), "/elsewhere/x.js"],
    ["f", "wasm://wasm/0011d6a2", "wasm (e.g. undici's llhttp)"],
  ])("%s at %s → %s", (fn, url, group) => {
    expect(groupOf(fn, url, root)).toBe(group);
  });
});

/**
 * Four nodes; samples start at 11,000, 11,500, 13,500, 14,500, 15,000, 15,500, 17,000, 18,000 and
 * 19,000 µs, each lasting until the next one starts (the last: until endTime, 20,000 µs).
 */
function profile(): CpuProfile {
  const frame = (functionName: string, url: string, lineNumber = 0) => ({
    functionName,
    url,
    lineNumber,
    columnNumber: 0,
  });
  return {
    nodes: [
      { id: 1, callFrame: frame("(root)", "") },
      { id: 2, callFrame: frame("(idle)", "") },
      { id: 3, callFrame: frame("decodeSse", file("/repo/src/upstream/vllm/decode-sse.ts"), 41) },
      { id: 4, callFrame: frame("route", file("/repo/node_modules/fastify/lib/route.js"), 9) },
    ],
    startTime: 10_000,
    endTime: 20_000,
    samples: [3, 3, 4, 2, 3, 3, 3, 4, 2],
    timeDeltas: [1000, 500, 2000, 1000, 500, 500, 1500, 1000, 1000],
  };
}

describe("summariseProfile", () => {
  it("sums self time per group and function, idle apart, over the whole profile", () => {
    const s = summariseProfile(profile(), { root });
    expect(s.idleMs).toBe(1.5); // 0.5 ms + the last sample's 1 ms until endTime
    expect(s.busyMs).toBe(7.5); // decodeSse 0.5 + 2 + 0.5 + 1.5 + 1; route 1 + 1
    expect(s.groups).toStrictEqual([
      { label: "src/upstream", selfMs: 5.5, share: 5.5 / 7.5 },
      { label: "fastify", selfMs: 2, share: 2 / 7.5 },
    ]);
    expect(s.functions[0]).toStrictEqual({
      label: "decodeSse (src/upstream/vllm/decode-sse.ts:42)",
      group: "src/upstream",
      selfMs: 5.5,
      share: 5.5 / 7.5,
    });
    expect(s.functions[1]?.label).toBe("route (fastify/lib/route.js:10)");
  });

  it("counts only the samples that start inside the window", () => {
    // samples starting at 14,500 (idle, 0.5 ms), 15,000 and 15,500 (decodeSse, 0.5 + 1.5 ms)
    const s = summariseProfile(profile(), { root, fromUs: 14_000, toUs: 17_000 });
    expect(s.windowMs).toBe(3);
    expect(s.idleMs).toBe(0.5);
    expect(s.groups).toStrictEqual([{ label: "src/upstream", selfMs: 2, share: 1 }]);
  });

  it("names functions without line numbers when asked (tsx's output is mostly one line)", () => {
    const s = summariseProfile(profile(), { root, lineNumbers: false });
    expect(s.functions.map((f) => f.label)).toStrictEqual([
      "decodeSse (src/upstream/vllm/decode-sse.ts)",
      "route (fastify/lib/route.js)",
    ]);
  });

  it("renders both tables", () => {
    const md = summaryMarkdown(summariseProfile(profile(), { root }), 1);
    expect(md).toContain("| src/upstream | 6 | 73.3% |");
    expect(md).toContain("| 1 other groups | 2 | 26.7% |");
    expect(md).toContain("| `decodeSse (src/upstream/vllm/decode-sse.ts:42)` | src/upstream | 6 | 73.3% |");
  });

  it("reads a real profile written by node --cpu-prof", () => {
    const dir = mkdtempSync(join(tmpdir(), "acs-prof-test-"));
    try {
      const script = join(dir, "busy.mjs");
      writeFileSync(
        script,
        "function spin(){let x=0;const t=process.cpuUsage();while(process.cpuUsage(t).user<200000)for(let i=0;i<1e5;i++)x+=Math.sqrt(x+i);return x}spin();",
      );
      execFileSync(process.execPath, ["--cpu-prof", `--cpu-prof-dir=${dir}`, script]);
      const name = readdirSync(dir).find((f) => f.endsWith(".cpuprofile")) as string;
      const s = summariseProfile(JSON.parse(readFileSync(join(dir, name), "utf8")), { root: dir });
      const spin = s.functions.find((f) => f.label.startsWith("spin (busy.mjs:1)"));
      expect(spin?.group).toBe("busy.mjs");
      // The spin (200 ms of CPU) has the most self time of any function. (Not a share of the busy
      // time: samples are wall-clock, so on a loaded machine node's start-up, waiting for a CPU,
      // can take half of them; spread over many functions, none comes near the spin.)
      expect(s.functions[0]?.label).toBe(spin?.label);
      expect(spin?.selfMs).toBeGreaterThan(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
