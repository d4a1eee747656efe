/**
 * A fast fake vLLM for the hot-path benchmark: fixed answers and no model, so that what is measured
 * in front of it is the gateway's (or a proxy's) own cost. It speaks vLLM's OpenAI-compatible HTTP
 * contract in vLLM's exact JSON shapes (pydantic's compact `model_dump_json`, vLLM's field order):
 *
 * - `POST /v1/completions`, non-stream and stream: string, string[], int[] or int[][] prompts, `n`;
 *   every choice generates `min(max_tokens, chunks)` tokens (one token per stream chunk, words of a
 *   fixed list, token ids 1000 + k); `finish_reason` is `length` when max_tokens was reached, else
 *   `stop` (as at an EOS). `usage` on every non-stream answer; `prompt_token_ids` / `token_ids` when
 *   `return_token_ids`; the usage chunk (`choices: []`, nulls excluded) when
 *   `stream_options.include_usage`; usage on every chunk with `continuous_usage_stats`.
 *   Refused with vLLM's 400 envelope: logprobs, prompt_logprobs, echo and vllm_xargs (not faked).
 * - `POST /tokenize` `{model, prompt, add_special_tokens}` → `{count, max_model_len, tokens,
 *   token_strs}`: BOS (128000) unless `add_special_tokens: false`, then one id per
 *   whitespace-separated word (a hash of the word).
 * - `GET /v1/models`, `GET /health` (200, empty body), `GET /version`.
 *
 * Framing is uvicorn's: every SSE event is its own write (a separate TCP segment, as vLLM's
 * generator yields them one decoding step at a time), then `data: [DONE]\n\n`, then the chunked-body
 * terminator in a second, separate write. `hopMs` delays every answer (a simulated network hop
 * between the gateway and Inference); `chunkDelayMs` spaces stream chunks (0 = next event-loop turn).
 *
 * CLI: `node --import tsx bench/hotpath/fake-vllm.ts [--port 0] [--model NAME] [--chunks 16]
 * [--hop-ms 0] [--chunk-delay-ms 0] [--max-model-len 4096] [--exit-with-stdin]`; prints
 * `fake-vllm listening at http://127.0.0.1:PORT` on stdout once it listens.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

/** Options of {@link createFakeVllm}. Times in milliseconds. */
export interface FakeVllmOptions {
  /** The served model name (`--served-model-name`). @default "bench-model" */
  model?: string;
  /** Tokens generated per choice when max_tokens allows (one per stream chunk). @default 16 */
  chunks?: number;
  /** Added before every answer: a simulated network hop. @default 0 */
  hopMs?: number;
  /** Pause between two stream chunks; 0 = the next event-loop turn (still separate writes). @default 0 */
  chunkDelayMs?: number;
  /** `max_model_len` in /v1/models and /tokenize; longer requests get vLLM's 400. @default 4096 */
  maxModelLen?: number;
}

const WORDS = [" the", " sky", " is", " blue", " and", " the", " sea", " is", " calm", ",", " a", " bird"];
const BOS = 128000;

/** The text a choice of `tokens` generated tokens has (the fake always writes the same words). */
export function fakeCompletionText(tokens: number): string {
  let text = "";
  for (let k = 0; k < tokens; k++) text += WORDS[k % WORDS.length];
  return text;
}

/** The fake's token id for a word of a text prompt (stable, < 128000). */
function wordId(word: string): number {
  let h = 2166136261;
  for (let i = 0; i < word.length; i++) h = Math.imul(h ^ word.charCodeAt(i), 16777619);
  return (h >>> 0) % 120000;
}

/** Token ids of a text prompt as the fake tokenizes it. */
export function fakeTokenize(text: string, addSpecialTokens: boolean): number[] {
  const ids = text
    .split(/\s+/)
    .filter((w) => w !== "")
    .map(wordId);
  return addSpecialTokens ? [BOS, ...ids] : ids;
}

class BadRequest extends Error {
  constructor(
    message: string,
    readonly status = 400,
    readonly type = "BadRequestError",
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

function sendJson(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

function sendError(res: ServerResponse, err: BadRequest): void {
  sendJson(
    res,
    err.status,
    JSON.stringify({ error: { message: err.message, type: err.type, param: err.param, code: err.status } }),
  );
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    req.on("data", (b: Buffer) => parts.push(b));
    req.on("end", () =>
      resolve(parts.length === 1 ? (parts[0] as Buffer).toString() : Buffer.concat(parts).toString()),
    );
    req.on("error", reject);
  });
}

function parseJsonBody(text: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new BadRequest("The request body is not valid JSON.");
  }
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw new BadRequest("The body must be an object.");
  return v as Record<string, unknown>;
}

const isInts = (v: unknown): v is number[] => Array.isArray(v) && v.every((x) => Number.isInteger(x));

/** The prompts of a request as token ids. */
function promptIds(prompt: unknown, addSpecialTokens: boolean): number[][] {
  if (typeof prompt === "string") return [fakeTokenize(prompt, addSpecialTokens)];
  if (isInts(prompt) && prompt.length > 0) return [prompt];
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === "string"))
      return prompt.map((p) => fakeTokenize(p, addSpecialTokens));
    if (prompt.every((p) => isInts(p) && p.length > 0)) return prompt as number[][];
  }
  throw new BadRequest(
    "prompt must be a string, a list of strings, a list of token ids or a list of lists.",
    400,
    "BadRequestError",
    "prompt",
  );
}

/** Builds the fake's request handler (exported for tests that run it in-process). */
export function createFakeVllm(opts: FakeVllmOptions = {}): Server {
  const model = opts.model ?? "bench-model";
  const chunks = opts.chunks ?? 16;
  const hopMs = opts.hopMs ?? 0;
  const chunkDelayMs = opts.chunkDelayMs ?? 0;
  const maxModelLen = opts.maxModelLen ?? 4096;
  const startedAt = Math.floor(Date.now() / 1000);
  const modelJson = JSON.stringify(model);
  let nextId = 0;

  const modelsText = JSON.stringify({
    object: "list",
    data: [
      {
        id: model,
        object: "model",
        created: startedAt,
        owned_by: "vllm",
        root: model,
        parent: null,
        max_model_len: maxModelLen,
        permission: [
          {
            id: "modelperm-bench",
            object: "model_permission",
            created: startedAt,
            allow_create_engine: false,
            allow_sampling: true,
            allow_logprobs: true,
            allow_search_indices: false,
            allow_view: true,
            allow_fine_tuning: false,
            organization: "*",
            group: null,
            is_blocking: false,
          },
        ],
      },
    ],
  });

  function tokenize(body: Record<string, unknown>, res: ServerResponse): void {
    if (body.model !== undefined && body.model !== model) {
      throw new BadRequest(
        `The model \`${String(body.model)}\` does not exist.`,
        404,
        "NotFoundError",
        "model",
      );
    }
    if (typeof body.prompt !== "string")
      throw new BadRequest("prompt must be a string.", 400, "BadRequestError", "prompt");
    const tokens = fakeTokenize(body.prompt, body.add_special_tokens !== false);
    sendJson(
      res,
      200,
      `{"count":${tokens.length},"max_model_len":${maxModelLen},"tokens":[${tokens.join(",")}],"token_strs":null}`,
    );
  }

  function complete(req: IncomingMessage, body: Record<string, unknown>, res: ServerResponse): void {
    if (body.model !== model) {
      throw new BadRequest(
        `The model \`${String(body.model)}\` does not exist.`,
        404,
        "NotFoundError",
        "model",
      );
    }
    for (const field of ["logprobs", "prompt_logprobs", "vllm_xargs"]) {
      if (body[field] !== undefined && body[field] !== null)
        throw new BadRequest(`The bench fake does not implement ${field}.`, 400, "BadRequestError", field);
    }
    if (body.echo === true)
      throw new BadRequest("The bench fake does not implement echo.", 400, "BadRequestError", "echo");
    const stream = body.stream === true;
    const streamOptions = body.stream_options as
      | { include_usage?: unknown; continuous_usage_stats?: unknown }
      | null
      | undefined;
    if (!stream && streamOptions !== undefined && streamOptions !== null) {
      throw new BadRequest(
        "Stream options can only be defined when `stream=True`.",
        400,
        "BadRequestError",
        "stream_options",
      );
    }
    const maxTokens = body.max_tokens === undefined || body.max_tokens === null ? 16 : body.max_tokens;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1) {
      throw new BadRequest("max_tokens must be at least 1.", 400, "BadRequestError", "max_tokens");
    }
    const n = body.n === undefined || body.n === null ? 1 : body.n;
    if (!Number.isInteger(n) || (n as number) < 1)
      throw new BadRequest("n must be at least 1.", 400, "BadRequestError", "n");
    const prompts = promptIds(body.prompt, body.add_special_tokens !== false);
    for (const p of prompts) {
      if (p.length + (maxTokens as number) > maxModelLen) {
        throw new BadRequest(
          `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${p.length + (maxTokens as number)} tokens (${p.length} in the messages, ${maxTokens} in the completion). Please reduce the length of the messages or completion.`,
          400,
          "BadRequestError",
          "input_tokens",
        );
      }
    }
    const generated = Math.min(maxTokens as number, chunks);
    const finish = generated === maxTokens ? '"length"' : '"stop"';
    const returnIds = body.return_token_ids === true;
    const headerId = req.headers["x-request-id"];
    const id = `cmpl-${typeof headerId === "string" && headerId !== "" ? headerId : `bench${++nextId}`}`;
    const head = `{"id":${JSON.stringify(id)},"object":"text_completion","created":${Math.floor(Date.now() / 1000)},"model":${modelJson}`;
    const choices = prompts.length * (n as number);
    const promptTokens = prompts.reduce((a, p) => a + p.length, 0);
    const completionTokens = choices * generated;
    const usage = (prompt: number, completion: number, details: boolean) =>
      `{"prompt_tokens":${prompt},"total_tokens":${prompt + completion},"completion_tokens":${completion}${details ? ',"prompt_tokens_details":null' : ""}}`;
    const promptOf = (choice: number) => prompts[Math.floor(choice / (n as number))] as number[];

    if (!stream) {
      const parts: string[] = [];
      for (let c = 0; c < choices; c++) {
        const text = fakeCompletionText(generated);
        const ids = Array.from({ length: generated }, (_, k) => 1000 + k);
        parts.push(
          `{"index":${c},"text":${JSON.stringify(text)},"logprobs":null,"finish_reason":${finish},"stop_reason":null,"token_ids":${returnIds ? `[${ids.join(",")}]` : "null"},"prompt_logprobs":null,"prompt_token_ids":${returnIds ? `[${promptOf(c).join(",")}]` : "null"}}`,
        );
      }
      sendJson(
        res,
        200,
        `${head},"choices":[${parts.join(",")}],"service_tier":null,"system_fingerprint":null,"usage":${usage(promptTokens, completionTokens, true)},"kv_transfer_params":null}`,
      );
      return;
    }

    const includeUsage = streamOptions?.include_usage === true;
    const continuous = streamOptions?.continuous_usage_stats === true;
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8" });
    // Events in vLLM's order: step k of every choice, choices interleaved; then usage; then [DONE].
    let step = 0;
    let choice = 0;
    let phase: "chunks" | "usage" | "done" | "end" = "chunks";
    const next = (): void => {
      if (res.destroyed) return;
      if (phase === "chunks") {
        const last = step === generated - 1;
        const tokenIds = returnIds ? `[${1000 + step}]` : "null";
        const promptIdsText = returnIds && step === 0 ? `[${promptOf(choice).join(",")}]` : "null";
        const p = promptOf(choice).length;
        const u = continuous ? usage(p, step + 1, true) : "null";
        res.write(
          `data: ${head},"choices":[{"index":${choice},"text":${JSON.stringify(WORDS[step % WORDS.length])},"logprobs":null,"finish_reason":${last ? finish : "null"},"stop_reason":null,"prompt_token_ids":${promptIdsText},"token_ids":${tokenIds}}],"usage":${u}}\n\n`,
        );
        if (++choice === choices) {
          choice = 0;
          if (++step === generated) phase = includeUsage ? "usage" : "done";
        }
      } else if (phase === "usage") {
        res.write(`data: ${head},"choices":[],"usage":${usage(promptTokens, completionTokens, false)}}\n\n`);
        phase = "done";
      } else if (phase === "done") {
        res.write("data: [DONE]\n\n");
        phase = "end";
      } else {
        res.end(); // the chunked terminator, in a write of its own (uvicorn)
        return;
      }
      if (chunkDelayMs > 0 && phase === "chunks") setTimeout(next, chunkDelayMs);
      else setImmediate(next);
    };
    next();
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = req.url?.split("?")[0] ?? "/";
    const route = `${req.method} ${path}`;
    const text = req.method === "POST" ? await readBody(req) : "";
    if (hopMs > 0) await new Promise((r) => setTimeout(r, hopMs));
    try {
      switch (route) {
        case "POST /v1/completions":
          return complete(req, parseJsonBody(text), res);
        case "POST /tokenize":
          return tokenize(parseJsonBody(text), res);
        case "GET /v1/models":
          return sendJson(res, 200, modelsText);
        case "GET /health":
          res.writeHead(200, { "content-length": 0 });
          res.end();
          return;
        case "GET /version":
          return sendJson(res, 200, '{"version":"0.19.0+bench-fake"}');
        default:
          return sendJson(res, 404, '{"detail":"Not Found"}');
      }
    } catch (err) {
      if (err instanceof BadRequest) return sendError(res, err);
      throw err;
    }
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) sendError(res, new BadRequest(String(err), 500, "InternalServerError"));
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 5000; // uvicorn's timeout_keep_alive
  return server;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      port: { type: "string", default: "0" },
      model: { type: "string", default: "bench-model" },
      chunks: { type: "string", default: "16" },
      "hop-ms": { type: "string", default: "0" },
      "chunk-delay-ms": { type: "string", default: "0" },
      "max-model-len": { type: "string", default: "4096" },
      "exit-with-stdin": { type: "boolean", default: false },
    },
  });
  const server = createFakeVllm({
    model: values.model,
    chunks: Number(values.chunks),
    hopMs: Number(values["hop-ms"]),
    chunkDelayMs: Number(values["chunk-delay-ms"]),
    maxModelLen: Number(values["max-model-len"]),
  });
  await new Promise<void>((r) => server.listen(Number(values.port), "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`fake-vllm listening at http://127.0.0.1:${port}\n`);
  if (values["exit-with-stdin"]) {
    process.stdin.on("close", () => process.exit(0));
    process.stdin.resume();
  }
  process.on("SIGTERM", () => process.exit(0));
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
