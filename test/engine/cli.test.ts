// The engine's command line as the gateway's npm start runs it (`--exit-with-stdin`, src/main.ts):
// it stops with its parent, whether the parent's end of stdin or of stdout goes first. A parent
// SIGTERMed while the engine was still starting left it writing its "serving" line into a closed
// pipe: it died of EPIPE with a stack trace on stderr.
import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";

const ENTRY = "src/engine/main.ts";

/** Starts the engine with pipes for stdin, stdout and stderr, as a parent would. */
function startEngine() {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", ENTRY, "--preset", "tiny", "--port", "0", "--exit-with-stdin"],
    { stdio: ["pipe", "pipe", "pipe"] },
  );
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (d: string) => {
    stderr += d;
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>(
    (resolve) => child.once("exit", (code, signal) => resolve({ code, signal, stderr })),
  );
  return { child, exited };
}

describe("engine CLI with --exit-with-stdin", () => {
  it("its parent's end of stdout closed before it prints: it exits 0, without a stack trace", async () => {
    const { child, exited } = startEngine();
    // The parent is gone as far as stdout goes; stdin stays open, so only the write can tell.
    child.stdout.destroy();
    const { code, signal, stderr } = await exited;
    expect(stderr).not.toMatch(/EPIPE|Error/);
    expect({ code, signal }).toEqual({ code: 0, signal: null });
  });

  it("its stdin ends once it serves: it exits 0", async () => {
    const { child, exited } = startEngine();
    child.stdout.setEncoding("utf8");
    await new Promise<void>((resolve) => {
      let out = "";
      child.stdout.on("data", (d: string) => {
        out += d;
        if (out.includes("serving")) resolve();
      });
    });
    child.stdin.end();
    const { code, signal, stderr } = await exited;
    expect(stderr).toBe("");
    expect({ code, signal }).toEqual({ code: 0, signal: null });
  });
});
