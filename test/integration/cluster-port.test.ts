// ACS_WORKERS=2 in front of a fake vLLM (ACS_MODELS, no embedded engine): what the port does when
// workers die or stall, and whether another process can take a share of it. The workers accept on
// one socket the primary bound (SCHED_NONE); these cases come from the review of a socket per
// worker (SO_REUSEPORT), which failed the last two, and of the primary, which failed the first.
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { type AddressInfo, createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { createFakeVllm } from "../../bench/hotpath/fake-vllm.js";
import { until } from "../helpers/hang-guard.js";
import { tcpSocketsOnPort, workerPidsOf } from "../helpers/proc.js";
import { freePort, startTs, waitForOk } from "../helpers/processes.js";

const dir = mkdtempSync(join(tmpdir(), "acs-cluster-port-"));
const fake = createFakeVllm({ model: "bench-model" });
let modelsPath: string;
let primary: ChildProcess | undefined;
const stopped: number[] = [];

beforeAll(async () => {
  await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
  modelsPath = join(dir, "models.json");
  const upstream = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  writeFileSync(
    modelsPath,
    JSON.stringify({
      models: [
        {
          id: "bench-model",
          upstream_url: upstream,
          hidden_size: 4096,
          num_hidden_layers: 32,
          byte_level_tokenizer: true,
        },
      ],
    }),
  );
});

afterEach(() => {
  for (const pid of stopped.splice(0)) {
    try {
      process.kill(pid, "SIGCONT");
    } catch {}
  }
  if (primary?.pid !== undefined) {
    for (const pid of workerPidsOf(primary.pid)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {}
    }
    primary.kill("SIGKILL");
  }
  primary = undefined;
});

afterAll(async () => {
  await new Promise<void>((r) => fake.close(() => r()));
  rmSync(dir, { recursive: true, force: true });
});

async function workersListening(url: string): Promise<number> {
  try {
    const text = await (await fetch(`${url}/metrics`)).text();
    const m = /^acs_cluster_workers (\S+)$/m.exec(text);
    return m?.[1] === undefined ? -1 : Number(m[1]);
  } catch {
    return -1;
  }
}

/** A gateway of two workers on 127.0.0.1; resolves once both listen. */
async function startGateway(): Promise<{ url: string; port: number; primary: ChildProcess }> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  primary = startTs(["src/main.ts"], {
    ACS_WORKERS: "2",
    // These cases stop workers on purpose; the primary's watchdog has its own (worker-timeout).
    ACS_WORKER_TIMEOUT_MS: "0",
    ACS_MODELS: modelsPath,
    PORT: String(port),
    ACS_LOG_LEVEL: "warn",
  });
  await waitForOk(`${url}/healthz`);
  await until(async () => (await workersListening(url)) === 2, "two workers listen");
  return { url, port, primary };
}

/** GET /healthz on a connection of its own: the status, or undefined when the connection failed. */
function freshGet(url: string): Promise<number | undefined> {
  return new Promise((resolve) => {
    const req = request(`${url}/healthz`, { agent: false, headers: { connection: "close" } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
      res.on("error", () => resolve(undefined));
    });
    req.on("error", () => resolve(undefined));
    req.end();
  });
}

describe("ACS_WORKERS=2: the port", () => {
  // The restart timer once was unref()ed: with no worker left and no embedded engine nothing kept
  // the primary's event loop alive; it exited 0 right after logging "worker exited; starting
  // another in its place" (twice), and a supervisor restarting on failure only did nothing.
  it("both workers SIGKILLed at once: they are started again and the port is served again", async () => {
    const gw = await startGateway();
    const exited = new Promise<string>((resolve) =>
      gw.primary.once("exit", (code, signal) =>
        resolve(`the primary exited (code ${code}, signal ${signal})`),
      ),
    );
    const victims = workerPidsOf(gw.primary.pid ?? 0);
    expect(victims).toHaveLength(2);
    for (const pid of victims) process.kill(pid, "SIGKILL");
    const served = until(async () => (await workersListening(gw.url)) === 2, "two workers listen again").then(
      () => "served",
    );
    expect(await Promise.race([exited, served])).toBe("served");
    expect(workerPidsOf(gw.primary.pid ?? 0).some((pid) => victims.includes(pid))).toBe(false);
  });

  // With a socket per worker (SO_REUSEPORT) any process of the same user that binds the port with
  // SO_REUSEPORT joins their group and the kernel hands it a share of the gateway's connections (a
  // third of them in the review; all of them for 127.0.0.1 when the gateway listens on 0.0.0.0).
  // The shared socket has no SO_REUSEPORT: such a bind gets EADDRINUSE, as a second gateway does.
  it("while the gateway listens, another process cannot bind its port with SO_REUSEPORT", async () => {
    const gw = await startGateway();
    const other: Server = createServer((s) => s.destroy());
    const outcome = await new Promise<string>((resolve) => {
      other.once("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? String(err)));
      // `reusePort`: Node 22.12+ (ignored before, where the bind is a plain one).
      other.listen({ host: "127.0.0.1", port: gw.port, reusePort: true } as never, () =>
        resolve("listening"),
      );
    });
    if (outcome === "listening") await new Promise<void>((r) => other.close(() => r()));
    expect(outcome).toBe("EADDRINUSE");
  });

  // With a socket per worker the kernel kept queueing half of the new connections on the stopped
  // worker's own socket, where they waited until it ran again. On the shared socket the worker that
  // runs accepts them all (round robin: the one connection handed to the stopped worker waits).
  it("a worker whose event loop does not run (SIGSTOP) holds at most one new connection", async () => {
    const gw = await startGateway();
    const [victim] = workerPidsOf(gw.primary.pid ?? 0);
    expect(victim).toBeDefined();
    process.kill(victim as number, "SIGSTOP");
    stopped.push(victim as number);
    const n = 20;
    let answered = 0;
    for (let i = 0; i < n; i++) {
      void freshGet(gw.url).then((status) => {
        if (status === 200) answered++;
      });
    }
    // Every connection is either answered or waits in an accept queue that only the stopped worker
    // serves (a socket of its own). A shared socket's queue is not counted: the worker that runs
    // takes what waits there. With round robin, the one connection handed to the stopped worker is
    // in neither: n - 1 answers.
    const queued = () => {
      const others = new Set(
        [gw.primary.pid ?? 0, ...workerPidsOf(gw.primary.pid ?? 0).filter((pid) => pid !== victim)].flatMap(
          (pid) => tcpSocketsOnPort(pid, gw.port).map((s) => s.inode),
        ),
      );
      return tcpSocketsOnPort(victim as number, gw.port)
        .filter((s) => s.state === "0A" && !others.has(s.inode))
        .reduce((a, s) => a + s.rxQueue, 0);
    };
    await until(() => answered + queued() >= n - 1, "every connection answered or queued");
    const waiting = queued();
    expect(
      answered,
      `${answered} of ${n} answered; ${waiting} wait on the stopped worker`,
    ).toBeGreaterThanOrEqual(n - 1);
  });
});
