// The embedded reference engine (no ACS_MODELS): a child process on a loopback port, supervised
// (started again when it dies) and stopped after the gateway's close. src/main.ts finds the
// program (only it imports src/engine) and starts it here; with ACS_WORKERS the primary does.
import { type ChildProcess, spawn } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import type { Config, ModelConfig } from "../config/index.js";

/** The reference engine's program, as src/main.ts finds it (src/engine's presets and main file). */
export interface EngineProgram {
  /** The preset's name (ACS_ENGINE_PRESET; `llama-8b` when unset). */
  readonly preset: string;
  /** The preset's served model name and dimensions (src/engine/presets.ts `getPreset`). */
  readonly dims: {
    readonly servedModelName: string;
    readonly hiddenSize: number;
    readonly numLayers: number;
  };
  /** The engine's main file, an absolute path (dist/src/engine/main.js under `npm start`, .ts under tsx). */
  readonly entry: string;
}

/** A running embedded engine: the model it serves, whether it listens now, and its end. */
export interface EmbeddedEngine {
  readonly model: ModelConfig;
  /** False from the child's exit until a restarted one listens. */
  isAlive(): boolean;
  /** Ends the supervision and the child (SIGTERM); resolves once it has exited. */
  stop(): Promise<void>;
}

/** Back-off before restarting the embedded engine after its n-th exit in a row (0-based), ms. */
const engineRestartDelayMs = (n: number): number => Math.min(30_000, 500 * 2 ** n);
/** An engine that stayed up this long is counted as healthy: the back-off starts over, ms. */
const ENGINE_STABLE_MS = 60_000;

/** The supervision's state: the child now, whether it listens, and the stop. */
interface Supervision {
  readonly program: EngineProgram;
  readonly logger: Logger;
  child: ChildProcess | undefined;
  alive: boolean;
  readonly stopping: AbortController;
}

/** One spawned child: its exit, and its URL once it listens (rejects if it exits first). */
interface Spawned {
  readonly child: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly listening: Promise<string>;
}

/**
 * Starts the reference engine as a child process on a loopback port (as Inference runs beside the
 * gateway in production): its CPU-bound forward passes and tokenizer then never block the
 * gateway's event loop. Resolves once it listens (rejects if it exits first); the child is killed
 * when this process exits.
 *
 * The child leads a process group of its own, so a signal to the gateway's group (Ctrl-C,
 * `kill -- -PGID`, systemd's KillMode=control-group) does not reach it: the gateway drains with
 * it serving and stops it afterwards (`stop()`, an onClose hook). It never outlives the gateway:
 * it exits when its stdin (a pipe from this process) ends, which a SIGKILL of this process does too.
 *
 * Supervised: when the child dies (a crash, `kill -9`), it is started again on the same port after
 * a back-off (0.5 s, doubling to 30 s; back to 0.5 s once it has stayed up a minute), each step
 * logged; `isAlive()` (hence `/readyz` and gRPC health) is false until it listens again. `stop()`
 * ends the supervision and the child.
 */
export async function startEmbeddedEngine(
  config: Config,
  logger: Logger,
  program: EngineProgram,
): Promise<EmbeddedEngine> {
  const engine: Supervision = {
    program,
    logger,
    child: undefined,
    alive: false,
    stopping: new AbortController(),
  };
  process.on("exit", () => engine.child?.kill("SIGTERM"));
  const first = spawnEngine(engine, 0);
  const url = await first.listening;
  engine.alive = true;
  logger.info(
    { url, preset: program.preset, model: program.dims.servedModelName, enginePid: first.child.pid },
    "reference engine started (no ACS_MODELS)",
  );
  const supervised = supervise(engine, first, url);
  return {
    model: embeddedModel(config, program, url),
    isAlive: () => engine.alive,
    stop: () => stopEngine(engine, supervised),
  };
}

/** The models-file entry of the engine's one model, served at `url`. */
function embeddedModel(config: Config, { dims }: EngineProgram, url: string): ModelConfig {
  return {
    id: dims.servedModelName,
    aliases: config.embeddedEngine?.aliases ?? [],
    upstreams: [{ url, apiKey: undefined, weight: 1 }],
    servedModelName: dims.servedModelName,
    maxModelLen: undefined, // read from the engine's /v1/models
    hiddenSize: dims.hiddenSize,
    numLayers: dims.numLayers,
    ownedBy: "acs-reference-engine",
    byteLevelTokenizer: true, // the engine's tokenizers (byte, Llama 3) are byte-level BPE
  };
}

/** Spawns the engine on `port` (0: any); its `listening` resolves with its URL once it listens. */
function spawnEngine(engine: Supervision, port: number): Spawned {
  const { entry, preset } = engine.program;
  const c = spawn(
    process.execPath,
    [...process.execArgv, entry, "--preset", preset, "--port", String(port), "--exit-with-stdin"],
    { stdio: ["pipe", "pipe", "inherit"], detached: true },
  );
  engine.child = c;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    c.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const listening = new Promise<string>((resolve, reject) => {
    let out = "";
    c.stdout?.setEncoding("utf8");
    const onData = (d: string) => {
      out += d;
      const m = /serving .* at (http:\/\/[^\s]+)/.exec(out);
      if (!m?.[1]) return;
      c.stdout?.off("data", onData);
      c.stdout?.resume(); // its later output is not kept
      resolve(m[1]);
    };
    c.stdout?.on("data", onData);
    void exited.then(({ code, signal }) =>
      reject(new Error(`reference engine exited (code ${code}, signal ${signal}) before listening`)),
    );
  });
  return { child: c, exited, listening };
}

/** The supervision loop: wait for the child's exit, back off, start it again on the same port. */
async function supervise(engine: Supervision, running: Spawned, url: string): Promise<void> {
  const { logger, stopping } = engine;
  const port = Number(new URL(url).port);
  let current = running;
  let failures = 0;
  let upSince = Date.now();
  for (;;) {
    const { code, signal } = await current.exited;
    engine.alive = false;
    if (stopping.signal.aborted) return;
    if (Date.now() - upSince >= ENGINE_STABLE_MS) failures = 0;
    const delayMs = engineRestartDelayMs(failures);
    failures += 1;
    logger.error(
      { code, signal, enginePid: current.child.pid, restartInMs: delayMs, attempt: failures },
      `reference engine exited; restarting it in ${delayMs} ms (not ready meanwhile)`,
    );
    try {
      await sleep(delayMs, undefined, { signal: stopping.signal });
    } catch {
      return;
    }
    current = spawnEngine(engine, port);
    try {
      await current.listening;
    } catch (err) {
      logger.error({ err, attempt: failures }, "reference engine restart failed");
      continue;
    }
    if (stopping.signal.aborted) return;
    engine.alive = true;
    upSince = Date.now();
    logger.info({ url, enginePid: current.child.pid, attempt: failures }, "reference engine restarted");
  }
}

/** Ends the supervision, then the child (SIGTERM), waiting for its exit and the loop's end. */
async function stopEngine(engine: Supervision, supervised: Promise<void>): Promise<void> {
  engine.stopping.abort();
  const c = engine.child;
  if (c !== undefined && c.exitCode === null && c.signalCode === null) {
    const gone = new Promise<void>((resolve) => c.once("exit", () => resolve()));
    c.kill("SIGTERM");
    await gone;
  }
  await supervised;
  engine.logger.info("reference engine stopped");
}
