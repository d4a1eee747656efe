/**
 * The real gateway (src/main.ts) as a child process for `npm run soak`, with `--expose-gc` and the
 * test-only {@link HeapReading} probe preloaded (bench/heap-probe.ts) on an IPC channel, and a
 * scripted Inference on loopback that answers what the gateway asks before and around a completion.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort, waitForOk } from "../test/helpers/processes.js";
import type { HeapReading } from "./heap-probe.js";
import { track } from "./hotpath/processes.js";

export type { HeapReading };

/** A gateway child process. */
export interface GatewayChild {
  /** http://127.0.0.1:PORT */
  readonly url: string;
  readonly process: ChildProcess;
  /** Heap after a full GC, RSS and peak RSS of the gateway process. */
  probe(): Promise<HeapReading>;
  /** True while the process runs. */
  alive(): boolean;
  /** SIGTERM, then waits for the exit. */
  stop(): Promise<void>;
}

const repoRoot = fileURLToPath(new URL("..", import.meta.url));
const probeModule = fileURLToPath(new URL("./heap-probe.ts", import.meta.url));

/** Facts of the model the soak's gateway serves (Llama-3.1-8B's shape). */
export const soakModel = { id: "soak", hiddenSize: 4096, numLayers: 32, maxModelLen: 1024 } as const;

/**
 * Starts src/main.ts serving {@link soakModel} from `upstreamUrl`, with `env` added (e.g. ACS_DB).
 * Resolves once `/healthz` answers.
 */
export async function startGatewayChild(upstreamUrl: string, env: Record<string, string> = {}) {
  const dir = mkdtempSync(join(tmpdir(), "acs-soak-"));
  const modelsFile = join(dir, "models.json");
  writeFileSync(
    modelsFile,
    JSON.stringify({
      models: [
        {
          id: soakModel.id,
          upstream_url: upstreamUrl,
          hidden_size: soakModel.hiddenSize,
          num_hidden_layers: soakModel.numLayers,
          max_model_len: soakModel.maxModelLen,
        },
      ],
    }),
  );
  const port = await freePort();
  // Tracked: killed when the soak exits, however it exits (a SIGTERM to `npm run soak` too).
  const child = track(
    spawn(process.execPath, ["--expose-gc", "--import", "tsx", "--import", probeModule, "src/main.ts"], {
      cwd: repoRoot,
      env: {
        ...process.env,
        ACS_WORKERS: "1",
        ACS_MODELS: modelsFile,
        PORT: String(port),
        ACS_LOG_LEVEL: "error",
        ...env,
      },
      stdio: ["ignore", "ignore", "inherit", "ipc"],
    }),
  );
  let exited = false;
  child.once("exit", () => {
    exited = true;
  });
  const url = `http://127.0.0.1:${port}`;
  await waitForOk(`${url}/healthz`, 60_000, 200);
  const gateway: GatewayChild = {
    url,
    process: child,
    alive: () => !exited,
    async probe() {
      const answer = once(child, "message") as Promise<[HeapReading]>;
      child.send("probe");
      const [reading] = await answer;
      return reading;
    },
    async stop() {
      if (!exited) {
        const gone = once(child, "exit");
        child.kill("SIGTERM");
        await gone;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
  return gateway;
}

/** What the scripted Inference does with a `POST /v1/completions`. */
export interface CompletionScript {
  /** Milliseconds to leave the request body unread before reading it. @default 0 */
  holdBodyMs?: number;
  /** Which bodies to hold, by their Content-Length (undefined: chunked). @default every body */
  holdWhen?: (contentLength: number | undefined) => boolean;
  /** Bytes per second to read the body at, after the hold (undefined = as fast as it comes). */
  readBytesPerSecond?: number;
  /** Told of each completion body once read: its byte length and text (kept only when asked). */
  onBody?: (bytes: number, text: string | undefined) => void;
  /** Keep each body's text for onBody. @default false */
  keepBodies?: boolean;
}

/** One SSE completion: a text chunk, the usage chunk, `[DONE]`. */
function answerStream(res: ServerResponse): void {
  const base = { id: "cmpl-soak", object: "text_completion", created: 1_700_000_000, model: soakModel.id };
  const events = [
    {
      ...base,
      choices: [
        { index: 0, text: " ok", logprobs: null, finish_reason: "length", stop_reason: null, token_ids: [7] },
      ],
      usage: null,
    },
    { ...base, choices: [], usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } },
  ];
  res.writeHead(200, { "content-type": "text/event-stream" });
  res.end(`${events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("")}data: [DONE]\n\n`);
}

async function readBody(
  req: IncomingMessage,
  script: CompletionScript,
): Promise<{ bytes: number; text?: string }> {
  const length = req.headers["content-length"];
  const held = script.holdWhen?.(length === undefined ? undefined : Number(length)) ?? true;
  if (script.holdBodyMs && held) {
    req.pause();
    await new Promise((r) => setTimeout(r, script.holdBodyMs));
  }
  const chunks: Buffer[] = [];
  let bytes = 0;
  const started = Date.now();
  for await (const chunk of req as AsyncIterable<Buffer>) {
    bytes += chunk.length;
    if (script.keepBodies) chunks.push(chunk);
    if (script.readBytesPerSecond !== undefined) {
      const due = started + (bytes / script.readBytesPerSecond) * 1000;
      const wait = due - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
  }
  return script.keepBodies ? { bytes, text: Buffer.concat(chunks).toString("utf8") } : { bytes };
}

/**
 * A scripted Inference on 127.0.0.1:0 serving {@link soakModel}: `/health`, `/v1/models`,
 * `/tokenize` (3 tokens for any prompt) and streamed `/v1/completions` (one token) per `script`.
 */
export async function startScriptedUpstream(script: CompletionScript = {}) {
  const server = createServer((req, res) => {
    void (async () => {
      const path = req.url ?? "";
      if (path === "/health") return void res.end();
      if (path === "/v1/models") {
        res.setHeader("content-type", "application/json");
        return void res.end(
          JSON.stringify({
            object: "list",
            data: [{ id: soakModel.id, object: "model", max_model_len: soakModel.maxModelLen }],
          }),
        );
      }
      if (path === "/tokenize") {
        await readBody(req, {});
        res.setHeader("content-type", "application/json");
        return void res.end(
          JSON.stringify({ count: 3, tokens: [1, 2, 3], max_model_len: soakModel.maxModelLen }),
        );
      }
      if (path === "/v1/completions") {
        const { bytes, text } = await readBody(req, script);
        script.onBody?.(bytes, text);
        return answerStream(res);
      }
      res.statusCode = 404;
      res.end();
    })().catch(() => res.destroy());
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** `n` bytes as MiB with one decimal. */
export const mib = (n: number): string => (n / 2 ** 20).toFixed(1);
