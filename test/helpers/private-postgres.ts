// A PostgreSQL server of one test file, to stop and start again (outage tests): initdb + pg_ctl of
// the machine's PostgreSQL, run as the `postgres` OS user, in a temporary directory, on a free
// loopback port. The machine's shared server (test/helpers/postgres.ts) is never touched.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { POSTGRES_REQUIRED } from "./postgres.js";

const run = promisify(execFile);

/** The newest PostgreSQL binaries' directory (`/usr/lib/postgresql/<major>/bin`), or undefined. */
function postgresBin(): string | undefined {
  const root = "/usr/lib/postgresql";
  if (!existsSync(root)) return undefined;
  const majors = readdirSync(root)
    .filter((d) => existsSync(join(root, d, "bin", "pg_ctl")))
    .sort((a, b) => Number(b) - Number(a));
  return majors[0] === undefined ? undefined : join(root, majors[0], "bin");
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A private server: `url` of its `postgres` database; stop() and start() it; remove() at the end. */
export interface PrivatePostgres {
  readonly url: string;
  readonly port: number;
  /** `pg_ctl stop -m fast`: sessions are ended, new connections refused until start(). */
  stop(): Promise<void>;
  start(): Promise<void>;
  /** Stops the server (if running) and deletes its directory. */
  remove(): Promise<void>;
}

/**
 * Starts a private PostgreSQL server, or returns why it cannot (not root, no `postgres` user, no
 * binaries): the caller skips with that reason — or fails, with ACS_TEST_POSTGRES=required.
 */
export async function startPrivatePostgres(): Promise<PrivatePostgres | { skipReason: string }> {
  const unavailable = (reason: string) => {
    if (POSTGRES_REQUIRED) throw new Error(`${reason}; ACS_TEST_POSTGRES=required`);
    return { skipReason: `${reason}: the PostgreSQL outage test is skipped` };
  };
  const bin = postgresBin();
  if (bin === undefined) return unavailable("no PostgreSQL binaries under /usr/lib/postgresql");
  if (process.getuid?.() !== 0) {
    return unavailable("a private PostgreSQL server is run as the postgres OS user, which needs root");
  }
  const dir = mkdtempSync(join(tmpdir(), "acs-private-pg-"));
  const data = join(dir, "data");
  const asPostgres = (cmd: string, args: string[]) =>
    run("runuser", ["-u", "postgres", "--", join(bin, cmd), ...args], { timeout: 60_000 });
  try {
    await run("chown", ["postgres", dir]);
    await asPostgres("initdb", ["-D", data, "-A", "trust", "-U", "postgres", "--no-sync"]);
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    return unavailable(`initdb as the postgres user failed (${(err as Error).message.split("\n")[0]})`);
  }
  const port = await freePort();
  let running = false;
  const start = async () => {
    await asPostgres("pg_ctl", [
      "-D",
      data,
      "-l",
      join(dir, "log"),
      "-w",
      "-o",
      `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off`,
      "start",
    ]);
    running = true;
  };
  const stop = async () => {
    await asPostgres("pg_ctl", ["-D", data, "-m", "fast", "-w", "stop"]);
    running = false;
  };
  try {
    await start();
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    return unavailable(`pg_ctl start failed (${(err as Error).message.split("\n")[0]})`);
  }
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    stop,
    start,
    async remove() {
      if (running) await stop().catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
