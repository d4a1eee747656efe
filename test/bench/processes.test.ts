// bench/hotpath/processes.ts: children of the benchmark die with it; process CPU time from /proc.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { processCpuSeconds, track } from "../../bench/hotpath/processes.js";

const fixture = fileURLToPath(new URL("./fixtures/spawn-then.ts", import.meta.url));

/** Gone: no /proc entry, or a zombie waiting for a reaper (it runs no more). */
function gone(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
  } catch {
    return true;
  }
}

async function waitGone(pids: number[]): Promise<number[]> {
  for (let i = 0; i < 100 && !pids.every(gone); i++) await new Promise((r) => setTimeout(r, 100));
  return pids.filter((p) => !gone(p));
}

/** Runs the fixture; resolves with the children's pids (once printed) and its exit. */
function runFixture(mode: "throw" | "wait") {
  const child = spawn(process.execPath, ["--import", "tsx", fixture, mode], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  const exit = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  const pids = new Promise<number[]>((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
      const line = out.split("\n").find((l) => l.startsWith("{"));
      if (line) resolve(Object.values(JSON.parse(line) as Record<string, number>));
    });
    child.once("exit", () => reject(new Error(`fixture exited before printing pids: ${out}`)));
  });
  return { child, exit, pids };
}

describe("bench child processes", () => {
  it("are killed when the bench fails with an exception", async () => {
    const run = runFixture("throw");
    const pids = await run.pids;
    expect(pids).toHaveLength(2);
    expect(await run.exit).not.toBe(0);
    expect(await waitGone(pids)).toStrictEqual([]);
  });

  it("are killed when the bench is interrupted (SIGINT)", async () => {
    const run = runFixture("wait");
    const pids = await run.pids;
    expect(pids.some(gone)).toBe(false);
    run.child.kill("SIGINT");
    expect(await run.exit).toBe(130);
    expect(await waitGone(pids)).toStrictEqual([]);
  });
});

describe("processCpuSeconds", () => {
  it("reads the CPU time a child has used", async () => {
    // The child spins until it has used 300 ms of CPU by its own count, then idles.
    const child = track(
      spawn(
        process.execPath,
        [
          "-e",
          "const t=process.cpuUsage();while(process.cpuUsage(t).user+process.cpuUsage(t).system<300000){}console.log('spun');setInterval(()=>{},1000)",
        ],
        { stdio: ["ignore", "pipe", "ignore"] },
      ),
    );
    try {
      await new Promise<void>((r) => child.stdout?.once("data", () => r()));
      const pid = child.pid as number;
      const seconds = processCpuSeconds(pid);
      expect(seconds).toBeGreaterThanOrEqual(0.29); // 10 ms ticks
      expect(seconds).toBeLessThan(60);
    } finally {
      child.kill("SIGKILL");
    }
  });
});
