// The gateway as an operator runs it: `npm start` (compiled JavaScript in dist/, the reference
// engine as a supervised child process). kill -9 of the engine: /readyz fails, the engine is
// started again (the log says so), /readyz recovers and completions succeed again. SIGTERM to the
// `npm start` process: the gateway and the engine are gone and the port is free.
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { afterAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { freePort } from "../helpers/processes.js";

const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
});

/** This process's environment without the gateway's variables, plus `env`. */
function envWith(env: Record<string, string>): NodeJS.ProcessEnv {
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(
      ([k]) => !k.startsWith("ACS_") && k !== "PORT" && k !== "HOST" && !k.startsWith("npm_"),
    ),
  );
  return { ...clean, ...env };
}

interface LogLine {
  msg: string;
  pid: number;
  [key: string]: unknown;
}

/** True while a process with this pid exists. */
function exists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** True when the port can be bound on 127.0.0.1 (nothing listens there). */
async function portFree(port: number): Promise<boolean> {
  const s = createServer();
  return new Promise((resolve) => {
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

const cmdline = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean);

async function complete(url: string): Promise<number> {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: 3 }),
  });
  await res.arrayBuffer();
  return res.status;
}

describe("npm start", () => {
  it("runs dist/, restarts a killed engine, and stops on SIGTERM to the npm process", async () => {
    const port = await freePort();
    const npm = spawn("npm", ["start"], {
      env: envWith({
        PORT: String(port),
        ACS_ENGINE_PRESET: "tiny",
        ACS_DRAIN_DELAY_MS: "0",
        ACS_LOG_LEVEL: "info",
      }),
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(npm);
    let stderr = "";
    npm.stderr?.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    const lines: LogLine[] = [];
    createInterface({ input: npm.stdout! }).on("line", (line) => {
      // npm's own banner lines (`> acs-gateway@… start`) are not JSON.
      if (line.startsWith("{")) lines.push(JSON.parse(line) as LogLine);
    });
    const npmExit = new Promise<number | null>((resolve) => npm.once("exit", (code) => resolve(code)));
    const line = (prefix: string, after = 0) => lines.slice(after).find((l) => l.msg.startsWith(prefix));
    await until(
      () => line("acs-gateway listening") !== undefined || npm.exitCode !== null,
      "the gateway listens",
      50,
    );
    expect(npm.exitCode, stderr).toBeNull();
    const url = `http://127.0.0.1:${port}`;
    const gatewayPid = line("acs-gateway listening")!.pid;
    const enginePid = line("reference engine started")!.enginePid as number;
    // Compiled JavaScript: npm execs node on dist/, the engine child runs dist/ too.
    expect(cmdline(gatewayPid).slice(1)).toEqual(["dist/src/main.js"]);
    expect(cmdline(enginePid)[1]).toMatch(/\/dist\/src\/engine\/main\.js$/);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    expect(await complete(url)).toBe(200);

    // kill -9 of the engine: not ready, restarted after a back-off, ready again, completions back.
    const before = lines.length;
    process.kill(enginePid, "SIGKILL");
    await until(async () => (await fetch(`${url}/readyz`)).status === 503, "/readyz fails");
    await until(() => line("reference engine restarted", before) !== undefined, "the engine restarted", 50);
    expect(line("reference engine exited; restarting it in", before)).toMatchObject({ signal: "SIGKILL" });
    const restartedPid = line("reference engine restarted", before)!.enginePid as number;
    expect(restartedPid).not.toBe(enginePid);
    await until(async () => (await fetch(`${url}/readyz`)).status === 200, "/readyz recovers");
    expect(await complete(url)).toBe(200);

    // SIGTERM to npm itself: the gateway drains and exits, the engine with it; the port is free.
    npm.kill("SIGTERM");
    expect(await npmExit).toBe(0);
    expect(exists(gatewayPid)).toBe(false);
    await until(() => !exists(restartedPid), "the engine is gone");
    expect(await portFree(port)).toBe(true);
    expect(lines.map((l) => l.msg)).toContain("stopped");
  });
});
