/**
 * Child processes of the benchmarks and their cleanup, and process CPU time from /proc.
 *
 * Every child started here is killed when this process exits, however it exits (normal end,
 * exception, SIGINT, SIGTERM, SIGHUP). Our own servers (fake vLLM, bare proxy) also exit when their
 * stdin closes, so they go away even if this process is SIGKILLed; the gateway cannot (src/ is not
 * the bench's to change) and is covered by the exit hooks only.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { readFileSync } from "node:fs";

const live = new Set<ChildProcess>();
let hooked = false;

function killAll(signal: NodeJS.Signals): void {
  for (const c of live) {
    if (c.exitCode === null && c.signalCode === null) c.kill(signal);
  }
  live.clear();
}

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", () => killAll("SIGKILL"));
  for (const [signal, code] of [
    ["SIGINT", 130],
    ["SIGTERM", 143],
    ["SIGHUP", 129],
  ] as const) {
    process.once(signal, () => {
      killAll("SIGKILL");
      process.exit(code);
    });
  }
}

/** Registers a child for cleanup at exit (used for forked workers too). */
export function track<C extends ChildProcess>(child: C): C {
  hookExit();
  live.add(child);
  child.once("exit", () => live.delete(child));
  return child;
}

/** A server running as a child process. */
export interface ServerProcess {
  readonly name: string;
  readonly pid: number;
  /** `http://127.0.0.1:PORT` */
  readonly url: string;
  readonly child: ChildProcess;
  /** The last lines it printed (stdout and stderr), for error messages. */
  output(): string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once it has exited. */
  stop(graceMs?: number): Promise<void>;
}

export interface SpawnServerOptions {
  /** Added to this process's environment. */
  env?: Record<string, string>;
  /** Working directory. @default this process's */
  cwd?: string;
  /** The URL it serves at, when known in advance (the gateway). Otherwise read from its stdout. */
  url?: string;
  /** Polled until 2xx when given; otherwise the stdout line `listening at URL` means ready. */
  readyPath?: string;
  /** @default 60_000 */
  timeoutMs?: number;
}

/**
 * Starts `argv` (argv[0] is the executable) and resolves once it is ready: its stdout printed
 * `listening at http://…`, or `url + readyPath` answered 2xx. Rejects with its output if it exits
 * or times out first (and kills it).
 */
export async function spawnServer(
  name: string,
  argv: readonly string[],
  opts: SpawnServerOptions = {},
): Promise<ServerProcess> {
  const [cmd, ...args] = argv as [string, ...string[]];
  const child = track(
    spawn(cmd, args, {
      env: { ...process.env, ...opts.env },
      stdio: ["pipe", "pipe", "pipe"],
      ...(opts.cwd === undefined ? {} : { cwd: opts.cwd }),
    }),
  );
  let tail = "";
  const keep = (d: Buffer) => {
    tail = (tail + d.toString()).slice(-4000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const stop = async (graceMs = 15_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  };
  const timeoutMs = opts.timeoutMs ?? 60_000;
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`${name} not ready within ${timeoutMs} ms`)),
        timeoutMs,
      );
      child.once("exit", (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`${name} exited (${code ?? signal}) before it was ready`));
      });
      if (opts.readyPath !== undefined && opts.url !== undefined) {
        const target = opts.url + opts.readyPath;
        const poll = async () => {
          while (child.exitCode === null) {
            try {
              if ((await fetch(target)).ok) {
                clearTimeout(timer);
                return resolve(opts.url as string);
              }
            } catch {}
            await new Promise((r) => setTimeout(r, 100));
          }
        };
        void poll();
      } else {
        child.stdout?.on("data", () => {
          const m = /listening at (http:\/\/\S+)/.exec(tail);
          if (m?.[1]) {
            clearTimeout(timer);
            resolve(m[1]);
          }
        });
      }
    });
    return { name, pid: child.pid as number, url, child, output: () => tail, stop };
  } catch (err) {
    child.kill("SIGKILL");
    throw new Error(`${(err as Error).message}\n--- ${name} output ---\n${tail}`);
  }
}

let clockTicks: number | undefined;

/** Clock ticks per second of /proc times (`getconf CLK_TCK`, usually 100). */
export function clockTicksPerSecond(): number {
  if (clockTicks === undefined) {
    try {
      clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
    } catch {
      clockTicks = 100;
    }
  }
  return clockTicks;
}

/**
 * CPU seconds (user + system, all threads) that process `pid` has used so far, from
 * /proc/<pid>/stat (fields 14 and 15, in clock ticks: 10 ms resolution at 100 Hz). Linux only.
 */
export function processCpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // The command name (field 2) may hold spaces and parentheses: fields are counted after the last ")".
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  return (utime + stime) / clockTicksPerSecond();
}
