// The gateway's process from the outside (child processes of src/main.ts): an operator's mistake
// is one line on stderr and exit code 2, never a stack trace (a keys database that cannot be opened
// too, with ACS_WORKERS=2 as well); the first log line comes before the slow part of the start;
// PORT=0 logs the port it bound. And `npm run keys -- list | head`.
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, describe, expect, it } from "vitest";
import { createBudgetLedger } from "../../src/budget/index.js";
import { POSTGRES_ADMIN_URL, POSTGRES_REQUIRED, postgresUnavailable } from "../helpers/postgres.js";
import { closedPortUrl } from "../upstream/fake-upstream.js";

const dir = mkdtempSync(join(tmpdir(), "acs-startup-"));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const c of children) c.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

/** This process's environment without the gateway's variables, plus `env`. */
function envWith(env: Record<string, string>): NodeJS.ProcessEnv {
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith("ACS_") && k !== "PORT" && k !== "HOST"),
  );
  return { ...clean, ...env };
}

function startGateway(env: Record<string, string>, args: string[] = ["src/main.ts"]): ChildProcess {
  const child = spawn(process.execPath, ["--import", "tsx", ...args], {
    env: envWith(env),
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  return child;
}

/** Runs the gateway to its exit: exit code and stderr. */
async function runToExit(env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  const child = startGateway(env);
  let stderr = "";
  child.stderr?.setEncoding("utf8").on("data", (d: string) => {
    stderr += d;
  });
  child.stdout?.resume();
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { code, stderr };
}

const modelsFile = (name: string, content: unknown): string => {
  const path = join(dir, name);
  writeFileSync(path, typeof content === "string" ? content : JSON.stringify(content));
  return path;
};

describe("an operator's mistake: one line, exit code 2", () => {
  let busy: Server;
  afterAll(() => busy?.close());

  it.each<[string, () => Promise<Record<string, string>>, RegExp]>([
    [
      "a bad log level",
      async () => ({ ACS_LOG_LEVEL: "loud" }),
      /^acs-gateway: ACS_LOG_LEVEL must be one of .*got "loud"$/,
    ],
    [
      "a missing models file",
      async () => ({ ACS_MODELS: join(dir, "nope.json") }),
      /^acs-gateway: ACS_MODELS=.*nope\.json: cannot read the models file: no such file$/,
    ],
    [
      "a typo in the models file",
      async () => ({
        ACS_MODELS: modelsFile("typo.json", {
          models: [{ id: "m", upstream_ulr: "http://127.0.0.1:1", hidden_size: 8, num_hidden_layers: 2 }],
        }),
      }),
      /^acs-gateway: .*typo\.json: models\[0\]: unknown key "upstream_ulr" \(allowed: .*\); models\[0\] needs exactly one of upstream_url/,
    ],
    [
      "a DB directory that does not exist",
      async () => ({ ACS_DB: join(dir, "no-such-dir", "acs.db"), ACS_ENGINE_PRESET: "tiny" }),
      /^acs-gateway: ACS_DB=.*acs\.db: the directory .*no-such-dir does not exist$/,
    ],
    [
      "a port in use",
      async () => {
        busy = createServer();
        await new Promise<void>((r) => busy.listen(0, "127.0.0.1", r));
        const port = (busy.address() as { port: number }).port;
        const upstream = await closedPortUrl();
        return {
          PORT: String(port),
          ACS_LOG_LEVEL: "silent",
          ACS_MODELS: modelsFile("busy.json", {
            models: [{ id: "m", upstream_url: upstream, hidden_size: 8, num_hidden_layers: 2 }],
          }),
        };
      },
      /^acs-gateway: PORT=\d+: the port is in use on 127\.0\.0\.1$/,
    ],
  ])("%s", async (_, env, expected) => {
    const { code, stderr } = await runToExit(await env());
    expect(code).toBe(2);
    const lines = stderr.trimEnd().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(expected);
    expect(stderr).not.toMatch(/^\s+at /m);
  });
});

describe("a keys database that cannot be opened: one line naming ACS_DB, exit code 2", () => {
  /** The environment of a gateway whose one model's replica is a closed port (checked at once). */
  const withDb = async (db: string, workers: string): Promise<Record<string, string>> => ({
    ACS_DB: db,
    ACS_WORKERS: workers,
    PORT: "0",
    ACS_LOG_LEVEL: "silent",
    ACS_MODELS: modelsFile(`db-${workers}.json`, {
      models: [{ id: "m", upstream_url: await closedPortUrl(), hidden_size: 8, num_hidden_layers: 2 }],
    }),
  });
  const closedPort = async () => new URL(await closedPortUrl()).port;
  const notADatabase = () => {
    const path = join(dir, "not-a.db");
    writeFileSync(path, "this is text, not a SQLite database ".repeat(8));
    return path;
  };

  const expectOneLine = async (env: Record<string, string>, expected: RegExp) => {
    const { code, stderr } = await runToExit(env);
    expect(stderr).not.toMatch(/^\s+at /m);
    expect(stderr).not.toContain("secret");
    const lines = stderr.trimEnd().split("\n");
    expect(lines, stderr).toHaveLength(1);
    expect(lines[0]).toMatch(expected);
    expect(code).toBe(2);
  };

  for (const workers of ["1", "2"]) {
    it(`PostgreSQL: a port with no server (ACS_WORKERS=${workers})`, async () => {
      const port = await closedPort();
      await expectOneLine(
        await withDb(`postgres://postgres:secret@127.0.0.1:${port}/acs`, workers),
        new RegExp(
          `^acs-gateway: ACS_DB=postgres://postgres:\\*\\*\\*@127\\.0\\.0\\.1:${port}/acs: no PostgreSQL server answers at 127\\.0\\.0\\.1:${port} \\(connection refused\\)$`,
        ),
      );
    });

    it(`SQLite: a file that is not a database (ACS_WORKERS=${workers})`, async () => {
      const path = notADatabase();
      await expectOneLine(
        await withDb(path, workers),
        new RegExp(`^acs-gateway: ACS_DB=${path}: cannot open the SQLite file: file is not a database$`),
      );
    });
  }

  describe("on a real PostgreSQL", () => {
    /** Skips the test without PostgreSQL (fails it with ACS_TEST_POSTGRES=required). */
    const needPostgres = async (skip: (note: string) => void) => {
      const reason = await postgresUnavailable();
      if (reason !== undefined && POSTGRES_REQUIRED) throw new Error(reason);
      if (reason !== undefined) skip(reason);
    };
    const admin = new URL(POSTGRES_ADMIN_URL);
    const at = (user: string, database: string) =>
      `postgres://${user}:secret@${admin.hostname}:${admin.port || "5432"}/${database}`;

    for (const workers of ["1", "2"]) {
      it(`a database that does not exist (ACS_WORKERS=${workers})`, async ({ skip }) => {
        await needPostgres(skip);
        await expectOneLine(
          await withDb(at(admin.username || "postgres", "acs_no_such_database"), workers),
          /^acs-gateway: ACS_DB=postgres:\/\/[^:]+:\*\*\*@[^/]+\/acs_no_such_database: PostgreSQL refused: database "acs_no_such_database" does not exist$/,
        );
      });
    }

    it("a login refused (no such role)", async ({ skip }) => {
      await needPostgres(skip);
      await expectOneLine(
        await withDb(at("acs_no_such_role", "postgres"), "1"),
        /^acs-gateway: ACS_DB=postgres:\/\/acs_no_such_role:\*\*\*@[^/]+\/postgres: PostgreSQL refused: role "acs_no_such_role" does not exist$/,
      );
    });
  });
});

describe("start-up log", () => {
  it("says it starts the reference engine before the engine is up, then the port PORT=0 bound", async () => {
    const child = startGateway({ ACS_ENGINE_PRESET: "tiny", PORT: "0", ACS_LOG_LEVEL: "info" });
    child.stderr?.resume();
    const lines: Array<{ msg: string; url?: string; port?: number }> = [];
    const rl = createInterface({ input: child.stdout! });
    const listening = new Promise<{ url?: string; port?: number }>((resolve, reject) => {
      rl.on("line", (line) => {
        const entry = JSON.parse(line) as { msg: string; url?: string; port?: number };
        lines.push(entry);
        if (entry.msg.startsWith("acs-gateway listening")) resolve(entry);
      });
      child.once("exit", (code) => reject(new Error(`exited with ${code}: ${JSON.stringify(lines)}`)));
    });
    const { url, port } = await listening;
    const messages = lines.map((l) => l.msg);
    expect(messages[0]).toMatch(/^starting the reference engine/);
    const engineUp = messages.findIndex((m) => m.startsWith("reference engine started"));
    expect(engineUp).toBeGreaterThan(0);
    expect(port).toBeGreaterThan(0);
    expect(url).toBe(`http://127.0.0.1:${port}`);
    // The listening line comes after the engine's, naming the port bound (fastify's own
    // "Server listening at" line may come before or after it: it is not ours to order).
    const listeningAt = messages.indexOf(`acs-gateway listening on ${url} (REST, Connect, gRPC-Web, gRPC)`);
    expect(listeningAt).toBeGreaterThan(engineUp);
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
  });
});

describe("npm run keys", () => {
  it("list into a reader that stops early (| head) ends quietly", async () => {
    const db = join(dir, "keys.db");
    const ledger = await createBudgetLedger({ path: db, reclaimIntervalMs: 0 });
    await ledger.createKey({ budgetTokens: 10, name: "a" });
    await ledger.close();
    const child = startGateway({ ACS_DB: db }, ["src/budget/cli.ts", "list"]);
    // The reader is gone before the CLI writes its first line: every write meets a closed pipe.
    child.stdout?.destroy();
    let stderr = "";
    child.stderr?.setEncoding("utf8").on("data", (d: string) => {
      stderr += d;
    });
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    expect([code, stderr]).toEqual([0, ""]);
  });
});
