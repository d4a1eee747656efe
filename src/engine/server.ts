/**
 * The HTTP server: vLLM's OpenAI-compatible routes over the engine, with vllm-lens fields.
 * Routes: POST /v1/completions (JSON or SSE), POST /tokenize, POST /detokenize, GET /v1/models,
 * GET /health, GET /version, GET /metrics. Errors use vLLM's envelope
 * `{"error": {"message", "type", "param", "code": <status>}}`.
 */
import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import type { ServerResponse } from "node:http";
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import { badWordsTokenIds } from "./bad-words.js";
import { Scheduler, type Sequence, type StepOutput } from "./engine-core.js";
import { installJsonParser } from "./json-body.js";
import type { Model } from "./model.js";
import type { PresetDims } from "./presets.js";
import { type CompletionRequest, parseCompletionRequest, type SchedulingPolicy } from "./protocol.js";
import type { TokenLogprobs } from "./sampler.js";
import { EngineError, parseSteeringVectors, type SteeringVector } from "./steering.js";
import { encodeBf16Tensor, type TensorDict } from "./tensor-codec.js";
import type { Tokenizer } from "./tokenizer.js";

/** vLLM's --max-logprobs default. */
export const MAX_LOGPROBS = 20;
/** Largest steering tensor accepted, in values. */
const MAX_STEERING_VALUES = 1 << 26;
const VLLM_VERSION = "0.19.0";

/** Counters of the engine's requests (completions only). */
export interface EngineStats {
  /** Every `POST /v1/completions` that reached the server, counted before its body is read: refused or not. */
  received: number;
  aborted: number;
  completed: number;
  active: number;
}

export interface ServerDeps {
  preset: PresetDims;
  model: Model;
  tokenizer: Tokenizer;
  servedModelName: string;
  maxModelLen: number;
  /** vLLM `--scheduling-policy`. @default "priority" (the API offers `priority`) */
  schedulingPolicy?: SchedulingPolicy;
}

/** A built (not yet listening) server. */
export interface EngineServer {
  app: FastifyInstance;
  stats: EngineStats;
  events: EventEmitter;
}

function envelope(message: string, type: string, status: number, param: string | null = null) {
  return { error: { message, type, param, code: status } };
}

function typeForStatus(status: number): string {
  if (status === 404) return "NotFoundError";
  if (status === 400 || status === 413 || status === 415 || status === 422) return "BadRequestError";
  if (status === 503) return "ServiceUnavailableError";
  return "InternalServerError";
}

const clampLp = (x: number): number => (Number.isFinite(x) ? Math.max(x, -9999.0) : x > 0 ? x : -9999.0);

/** Builds the fastify app. */
export function createEngineServer(deps: ServerDeps): EngineServer {
  const { model, tokenizer: tok, servedModelName, maxModelLen, preset } = deps;
  const created = Math.floor(Date.now() / 1000);
  const scheduler = new Scheduler(model, tok, preset.prefillChunk);
  const stats: EngineStats = { received: 0, aborted: 0, completed: 0, active: 0 };
  const events = new EventEmitter();
  const app = Fastify({
    logger: false,
    bodyLimit: 256 * 1024 * 1024,
    onProtoPoisoning: "remove",
    onConstructorPoisoning: "remove",
  });
  installJsonParser(app);
  const tokenText = (id: number): string => tok.decode([id], false);

  app.setErrorHandler((err: Error & { statusCode?: number }, _req, reply) => {
    if (err instanceof EngineError) {
      void reply.status(err.status).send(envelope(err.message, err.type, err.status, err.param));
      return;
    }
    const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
    void reply.status(status).send(envelope(err.message, typeForStatus(status), status));
  });
  app.setNotFoundHandler((_req, reply) => {
    void reply.status(404).send({ detail: "Not Found" });
  });

  const checkModel = (name: unknown): void => {
    if (name !== undefined && name !== null && name !== servedModelName) {
      throw new EngineError(`The model \`${String(name)}\` does not exist.`, 404, "NotFoundError", "model");
    }
  };

  app.get("/health", async (_req, reply) => {
    await reply.status(200).send("");
  });
  app.get("/version", async () => ({ version: VLLM_VERSION }));
  app.get("/metrics", async (_req, reply) => {
    await reply
      .type("text/plain; version=0.0.4")
      .send(
        `vllm:num_requests_running{model_name="${servedModelName}"} ${stats.active}\n` +
          `acs_engine_completed_total ${stats.completed}\nacs_engine_aborted_total ${stats.aborted}\n`,
      );
  });
  app.get("/v1/models", async () => ({
    object: "list",
    data: [
      {
        id: servedModelName,
        object: "model",
        created,
        owned_by: "vllm",
        root: servedModelName,
        parent: null,
        max_model_len: maxModelLen,
        permission: [],
      },
    ],
  }));
  app.post("/tokenize", async (req) => {
    const b = (req.body ?? {}) as Record<string, unknown>;
    checkModel(b.model);
    if (typeof b.prompt !== "string")
      throw new EngineError("prompt must be a string", 400, "BadRequestError", "prompt");
    const add = b.add_special_tokens ?? true;
    if (typeof add !== "boolean") {
      throw new EngineError(
        "add_special_tokens must be a boolean",
        400,
        "BadRequestError",
        "add_special_tokens",
      );
    }
    const strs = b.return_token_strs ?? false;
    if (typeof strs !== "boolean") {
      throw new EngineError(
        "return_token_strs must be a boolean",
        400,
        "BadRequestError",
        "return_token_strs",
      );
    }
    const tokens = await tok.encodeAsync(b.prompt, add);
    // vLLM gives the tokenizer's piece of each token (convert_ids_to_tokens); here, its decoded text.
    const token_strs = strs ? tokens.map(tokenText) : null;
    return { count: tokens.length, max_model_len: maxModelLen, tokens, token_strs };
  });
  app.post("/detokenize", async (req) => {
    const b = (req.body ?? {}) as Record<string, unknown>;
    checkModel(b.model);
    const t = b.tokens;
    if (!Array.isArray(t) || !t.every((x) => Number.isInteger(x))) {
      throw new EngineError("tokens must be a list of integers", 400, "BadRequestError", "tokens");
    }
    for (const id of t as number[]) {
      if (id < 0 || id >= tok.vocabSize) {
        throw new EngineError(`Token id ${id} is out of vocabulary`, 400, "BadRequestError", "tokens");
      }
    }
    return { prompt: tok.decode(t as number[], true) };
  });

  app.post(
    "/v1/completions",
    {
      onRequest: async () => {
        stats.received++;
      },
    },
    async (req, reply) => {
      await handleCompletion(req, reply);
    },
  );

  interface Choice {
    index: number;
    promptIndex: number;
    seq: Sequence | null;
    promptIds: number[];
    promptText: string;
    tokenIds: number[];
    lps: TokenLogprobs[];
    text: string;
    textOffset: number;
    started: boolean;
    finished: boolean;
  }

  async function handleCompletion(req: FastifyRequest, reply: FastifyReply): Promise<void> {
    const headerId = req.headers["x-request-id"];
    const cr = parseCompletionRequest(
      req.body,
      typeof headerId === "string" && headerId !== "" ? headerId : null,
      deps.schedulingPolicy ?? "priority",
    );
    checkModel(cr.model);
    const requestId = `cmpl-${cr.requestId ?? randomUUID().replaceAll("-", "")}`;
    const modelName = cr.model ?? servedModelName;
    const p = cr.params;

    // tokenize + context-length check (serving layer: a real 400 even on a stream)
    // encodeAsync: a huge prompt is tokenized in slices, so it does not block other requests
    const prompts: { ids: number[]; text: string }[] = [];
    for (const pr of cr.prompts) {
      const ids = pr.kind === "text" ? await tok.encodeAsync(pr.text, cr.addSpecialTokens) : pr.ids;
      const text = pr.kind === "text" ? pr.text : safeDecode(ids, p.skipSpecialTokens);
      prompts.push({ ids, text });
    }
    const badWordIds = badWordsTokenIds(tok, p.badWords);
    const maxTokensPer: number[] = [];
    for (const pr of prompts) {
      const P = pr.ids.length;
      const M = cr.maxTokensGiven ?? Math.min(16, maxModelLen - P);
      if (P + Math.max(M, 1) > maxModelLen) {
        const req = cr.maxTokensGiven ?? 1;
        throw new EngineError(
          `You passed ${P} input tokens and requested ${req} output tokens. However, the model's context length is only ${maxModelLen} tokens, resulting in a maximum input length of ${Math.max(0, maxModelLen - req)} tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=${P})`,
          400,
          "BadRequestError",
          "input_tokens",
        );
      }
      maxTokensPer.push(M);
    }

    // vllm-lens fields (set before generation: a real 400)
    const lensActive = p.n === 1;
    let steering: SteeringVector[] = [];
    if (cr.applySteeringVectors !== undefined && cr.applySteeringVectors !== null) {
      const parsed = await parseSteeringVectors(
        cr.applySteeringVectors,
        model.shape.numLayers,
        MAX_STEERING_VALUES,
      );
      if (lensActive) steering = parsed;
    }
    const capture = lensActive ? captureLayers(cr.outputResidualStream, model.shape.numLayers) : null;

    // engine-side checks: in-band on a stream
    let engineError: EngineError | null = null;
    if (p.logprobs !== null && p.logprobs > MAX_LOGPROBS) {
      engineError = new EngineError(
        `Requested sample logprobs of ${p.logprobs}, which is greater than max allowed: ${MAX_LOGPROBS}`,
        400,
        "BadRequestError",
        "logprobs",
      );
    } else if (p.promptLogprobs !== null && p.promptLogprobs > MAX_LOGPROBS) {
      engineError = new EngineError(
        `Requested prompt logprobs of ${p.promptLogprobs}, which is greater than max allowed: ${MAX_LOGPROBS}`,
        400,
        "BadRequestError",
        "prompt_logprobs",
      );
    } else {
      const oov = prompts.flatMap((pr) => pr.ids).find((id) => id >= tok.vocabSize);
      if (oov !== undefined)
        engineError = new EngineError(
          `Token id ${oov} is out of vocabulary`,
          400,
          "BadRequestError",
          "prompt",
        );
    }
    if (engineError && !cr.stream) throw engineError;

    const raw = reply.raw;
    const createdAt = Math.floor(Date.now() / 1000);
    const base = { id: requestId, object: "text_completion", created: createdAt, model: modelName };
    let sse: ServerResponse | null = null;
    if (cr.stream) {
      reply.hijack();
      raw.writeHead(200, {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
        connection: "keep-alive",
        "x-request-id": cr.requestId ?? requestId.slice(5),
      });
      sse = raw;
      if (engineError) {
        raw.write(
          `data: ${JSON.stringify(envelope(engineError.message, engineError.type, engineError.status))}\n\n`,
        );
        raw.end("data: [DONE]\n\n");
        return;
      }
    }
    const write = (obj: unknown): void => {
      if (sse && !sse.destroyed) sse.write(`data: ${JSON.stringify(obj)}\n\n`);
    };

    const promptLpK = Math.max(p.promptLogprobs ?? -1, cr.echo && p.logprobs !== null ? p.logprobs : -1);
    const choices: Choice[] = [];
    stats.active++;
    let settled = false;
    let resolveDone: () => void = () => {};
    const done = new Promise<void>((r) => {
      resolveDone = r;
    });
    const settle = (aborted: boolean): void => {
      if (settled) return;
      settled = true;
      stats.active--;
      if (aborted) {
        stats.aborted++;
        for (const c of choices) if (c.seq && !c.seq.finished) scheduler.remove(c.seq);
        events.emit("abort", requestId);
      } else {
        stats.completed++;
        events.emit("finish", requestId);
      }
      resolveDone();
    };
    raw.on("close", () => {
      if (!settled) settle(true);
    });

    const usageOf = () => {
      const promptTokens = prompts.reduce((a, pr) => a + pr.ids.length, 0);
      const completion = choices.reduce((a, c) => a + c.tokenIds.length, 0);
      return {
        prompt_tokens: promptTokens,
        total_tokens: promptTokens + completion,
        completion_tokens: completion,
      };
    };

    const renderLogprobs = (
      entries: { id: number; lp: number | null; top: { id: number; logprob: number }[] | null }[],
      startOffset: number,
    ) => {
      const text_offset: number[] = [];
      const token_logprobs: (number | null)[] = [];
      const tokens: string[] = [];
      const top_logprobs: (Record<string, number> | null)[] = [];
      let off = startOffset;
      for (const e of entries) {
        const s = tokenText(e.id);
        text_offset.push(off);
        off += s.length;
        tokens.push(s);
        token_logprobs.push(e.lp === null ? null : clampLp(e.lp));
        if (e.top === null) top_logprobs.push(null);
        else {
          const d: Record<string, number> = {};
          for (const t of e.top) d[tokenText(t.id)] = clampLp(t.logprob);
          if (e.lp !== null && !(s in d)) d[s] = clampLp(e.lp);
          top_logprobs.push(d);
        }
      }
      return { logprobs: { text_offset, token_logprobs, tokens, top_logprobs }, end: off };
    };

    const promptLpEntries = (seq: Sequence, ids: number[]) =>
      ids.map((id, i) => {
        const lp = i === 0 ? null : seq.promptLogprobs[i];
        return { id, lp: lp ? lp.logprob : null, top: lp ? lp.top : null };
      });

    const onStep = (c: Choice, out: StepOutput): void => {
      for (const id of out.tokenIds) c.tokenIds.push(id);
      for (const lp of out.logprobs) c.lps.push(lp);
      c.text += out.delta;
      if (out.finished) c.finished = true;
      if (sse) {
        const chunkChoices: Record<string, unknown>[] = [];
        const seq = c.seq!;
        if (!c.started) {
          c.started = true;
          if (cr.echo) {
            const echoChoice: Record<string, unknown> = {
              index: c.index,
              text: c.promptText,
              logprobs: null,
              finish_reason: null,
              stop_reason: null,
            };
            if (p.logprobs !== null) {
              const r = renderLogprobs(promptLpEntries(firstSeq(c.promptIndex), c.promptIds), 0);
              echoChoice.logprobs = r.logprobs;
              c.textOffset = r.end;
            } else c.textOffset = c.promptText.length;
            if (cr.returnTokenIds) echoChoice.prompt_token_ids = c.promptIds;
            const echoChunk: Record<string, unknown> = { ...base, choices: [echoChoice] };
            // vLLM sends the prompt with the first token, in a chunk with the usage so far.
            if (cr.continuousUsage) {
              const generated = c.tokenIds.length - out.tokenIds.length;
              echoChunk.usage = {
                prompt_tokens: c.promptIds.length,
                completion_tokens: generated,
                total_tokens: c.promptIds.length + generated,
              };
            }
            write(echoChunk);
          }
        }
        const ch: Record<string, unknown> = {
          index: c.index,
          text: out.delta,
          logprobs: null,
          finish_reason: out.finished ? seq.finishReason : null,
          stop_reason: out.finished ? seq.stopReason : null,
        };
        if (p.logprobs !== null) {
          const r = renderLogprobs(
            out.logprobs.map((lp) => ({ id: lp.id, lp: lp.logprob, top: lp.top })),
            c.textOffset,
          );
          ch.logprobs = r.logprobs;
          c.textOffset = r.end;
        }
        if (cr.returnTokenIds) {
          if (!cr.echo && c.tokenIds.length === out.tokenIds.length) ch.prompt_token_ids = c.promptIds;
          ch.token_ids = out.tokenIds;
        }
        chunkChoices.push(ch);
        const chunk: Record<string, unknown> = { ...base, choices: chunkChoices };
        if (cr.continuousUsage) {
          chunk.usage = {
            prompt_tokens: c.promptIds.length,
            completion_tokens: c.tokenIds.length,
            total_tokens: c.promptIds.length + c.tokenIds.length,
          };
        }
        write(chunk);
      }
      if (choices.every((x) => x.finished)) queueMicrotask(() => settle(false));
    };

    const firstSeq = (promptIndex: number): Sequence => choices[promptIndex * p.n]!.seq!;

    prompts.forEach((pr, pi) => {
      for (let k = 0; k < p.n; k++) {
        const c: Choice = {
          index: pi * p.n + k,
          promptIndex: pi,
          seq: null,
          promptIds: pr.ids,
          promptText: pr.text,
          tokenIds: [],
          lps: [],
          text: "",
          textOffset: 0,
          started: false,
          finished: false,
        };
        choices.push(c);
      }
    });
    for (const c of choices) {
      const k = c.index % p.n;
      const first = c.promptIndex === 0;
      c.seq = scheduler.add({
        promptIds: c.promptIds,
        params: { ...p, maxTokens: maxTokensPer[c.promptIndex]! },
        seed: p.seed === null ? null : p.seed + BigInt(k),
        steering: first ? steering : [],
        capture: first ? capture : null,
        promptLogprobsTopK: k === 0 ? promptLpK : -1,
        maxModelLen,
        badWordsTokenIds: badWordIds,
        onStep: (out) => onStep(c, out),
      });
    }

    await done;
    if (raw.destroyed || (settled && choices.some((c) => !c.finished))) {
      if (sse && !sse.destroyed) sse.end();
      return;
    }
    const usage = usageOf();
    if (sse) {
      if (cr.includeUsage) write({ ...base, choices: [], usage });
      sse.end("data: [DONE]\n\n");
      return;
    }
    const body: Record<string, unknown> = {
      ...base,
      choices: choices.map((c) => {
        const seq = c.seq!;
        let text = seq.text.text;
        let logprobs: unknown = null;
        if (p.logprobs !== null) {
          const gen = c.lps.map((lp) => ({ id: lp.id, lp: lp.logprob, top: lp.top }));
          const entries = cr.echo ? [...promptLpEntries(firstSeq(c.promptIndex), c.promptIds), ...gen] : gen;
          logprobs = renderLogprobs(entries, 0).logprobs;
        }
        if (cr.echo) text = c.promptText + text;
        const choice: Record<string, unknown> = {
          index: c.index,
          text,
          logprobs,
          finish_reason: seq.finishReason,
          stop_reason: seq.stopReason,
          prompt_logprobs:
            p.promptLogprobs !== null ? renderPromptLogprobs(firstSeq(c.promptIndex), c.promptIds) : null,
        };
        if (cr.returnTokenIds) {
          choice.prompt_token_ids = c.promptIds;
          choice.token_ids = c.tokenIds;
        }
        return choice;
      }),
      usage,
    };
    const first = choices[0]?.seq;
    if (first && capture) {
      const cap = first.captureBits();
      if (cap) body.activations = { residual_stream: encodeBf16Tensor(cap.bits, cap.shape) as TensorDict };
    }
    await reply.header("x-request-id", cr.requestId ?? requestId.slice(5)).send(body);

    function renderPromptLogprobs(seq: Sequence, ids: number[]) {
      return ids.map((id, i) => {
        if (i === 0) return null;
        const lp = seq.promptLogprobs[i];
        if (!lp) return null;
        const d: Record<string, { logprob: number; rank: number; decoded_token: string }> = {};
        d[String(id)] = { logprob: clampLp(lp.logprob), rank: lp.rank, decoded_token: tokenText(id) };
        lp.top.slice(0, p.promptLogprobs ?? 0).forEach((t, r) => {
          if (!(String(t.id) in d))
            d[String(t.id)] = { logprob: clampLp(t.logprob), rank: r + 1, decoded_token: tokenText(t.id) };
        });
        return d;
      });
    }
  }

  function safeDecode(ids: number[], skip: boolean): string {
    return tok.decode(
      ids.filter((id) => id >= 0 && id < tok.vocabSize),
      skip,
    );
  }

  return { app, stats, events };
}

/**
 * Layers to capture from `output_residual_stream` (a JSON string or a value): a list → those
 * layers that exist (indices are not validated, unknown ones never match), ascending; null → none;
 * any other value → all layers.
 */
export function captureLayers(value: unknown, numLayers: number): number[] | null {
  if (value === undefined || value === null) return null;
  let v: unknown = value;
  if (typeof value === "string") {
    try {
      v = JSON.parse(value);
    } catch {
      v = value;
    }
  }
  if (v === null) return null;
  const all = Array.from({ length: numLayers }, (_, i) => i);
  if (!Array.isArray(v)) return all;
  const set = new Set<number>();
  for (const x of v) if (Number.isInteger(x) && x >= 0 && x < numLayers) set.add(x as number);
  if (set.size === 0) return null;
  return [...set].sort((a, b) => a - b);
}

export type { CompletionRequest };
