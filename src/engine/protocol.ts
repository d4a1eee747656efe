/**
 * Parsing and validation of `POST /v1/completions` bodies as vLLM does it: unknown fields are
 * ignored; vLLM's own 400s for types, ranges and cross-field rules; defaults for omitted fields.
 * Engine-side checks (logprobs > 20, token ids out of vocabulary) are NOT done here — they run
 * when the request reaches the engine (in-band on a stream).
 */
import { GREEDY_EPS, type SamplingParams } from "./sampler.js";
import { EngineError } from "./steering.js";

/** A validated completion request (before tokenization and the engine-side checks). */
export interface CompletionRequest {
  model: string | null;
  /** Text prompts or token-id prompts. */
  prompts: ({ kind: "text"; text: string } | { kind: "ids"; ids: number[] })[];
  params: SamplingParams;
  /** null: max_tokens left out (vLLM then uses 16, or less when the context is shorter). */
  maxTokensGiven: number | null;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
  echo: boolean;
  addSpecialTokens: boolean;
  returnTokenIds: boolean;
  requestId: string | null;
  /** Raw lens values from vllm_xargs (parsed later). */
  outputResidualStream: unknown;
  applySteeringVectors: unknown;
}

const bad = (message: string, param: string | null = null): EngineError =>
  new EngineError(message, 400, "BadRequestError", param);

type Body = Record<string, unknown>;

function inputValue(value: unknown): string | undefined {
  return typeof value === "bigint" ? String(value) : JSON.stringify(value)?.slice(0, 80);
}

function typeError(field: string, want: string, value: unknown): EngineError {
  return bad(
    `1 validation error for CompletionRequest\n${field}\n  Input should be ${want} [input_value=${inputValue(value)}]`,
    field,
  );
}

/** vLLM's bounds on `seed`: torch.long (`Field(ge=_LONG_INFO.min, le=_LONG_INFO.max)`). */
export const SEED_MIN = -(2n ** 63n);
export const SEED_MAX = 2n ** 63n - 1n;

/**
 * `seed` as the exact integer vLLM sees (a Python int): a bigint from the body parser when the
 * literal is outside ±2^53 (see json-body.ts), or an integral number. Range: [−2^63, 2^63 − 1].
 */
function optSeed(b: Body): bigint | null {
  const v = b.seed;
  if (v === undefined || v === null) return null;
  let s: bigint;
  if (typeof v === "bigint") s = v;
  else if (typeof v === "number" && Number.isInteger(v)) s = BigInt(v);
  else throw typeError("seed", "a valid integer", v);
  if (s < SEED_MIN) throw typeError("seed", `greater than or equal to ${SEED_MIN}`, v);
  if (s > SEED_MAX) throw typeError("seed", `less than or equal to ${SEED_MAX}`, v);
  return s;
}

function optNumber(b: Body, f: string): number | null {
  const v = b[f];
  if (v === undefined || v === null) return null;
  if (typeof v !== "number" || !Number.isFinite(v)) throw typeError(f, "a valid number", v);
  return v;
}

function optInt(b: Body, f: string): number | null {
  const v = b[f];
  if (v === undefined || v === null) return null;
  if (typeof v !== "number" || !Number.isInteger(v)) throw typeError(f, "a valid integer", v);
  return v;
}

function optBool(b: Body, f: string): boolean | null {
  const v = b[f];
  if (v === undefined || v === null) return null;
  if (typeof v !== "boolean") throw typeError(f, "a valid boolean", v);
  return v;
}

function optIntList(b: Body, f: string): number[] | null {
  const v = b[f];
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "number" && Number.isInteger(x))) {
    throw typeError(f, "a valid list of integers", v);
  }
  return v as number[];
}

function optStringList(b: Body, f: string): string[] | null {
  const v = b[f];
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) {
    throw typeError(f, "a valid list of strings", v);
  }
  return v as string[];
}

function parsePrompt(v: unknown): CompletionRequest["prompts"] {
  if (v === undefined || v === null)
    throw bad("Either prompt or prompt_embeds must be provided and non-empty.", "prompt");
  if (typeof v === "string") return [{ kind: "text", text: v }];
  if (!Array.isArray(v)) throw typeError("prompt", "a valid string or list", v);
  if (v.length === 0) throw bad("Prompt cannot be empty", "prompt");
  if (v.every((x) => typeof x === "string")) return (v as string[]).map((text) => ({ kind: "text", text }));
  if (v.every((x) => typeof x === "number" && Number.isInteger(x))) {
    return [{ kind: "ids", ids: checkIds(v as number[]) }];
  }
  if (v.every((x) => Array.isArray(x) && x.every((y) => typeof y === "number" && Number.isInteger(y)))) {
    return (v as number[][]).map((ids) => {
      if (ids.length === 0) throw bad("Prompt cannot be empty", "prompt");
      return { kind: "ids", ids: checkIds(ids) };
    });
  }
  throw typeError(
    "prompt",
    "a string, a list of strings, a list of integers or a list of lists of integers",
    v,
  );
}

function checkIds(ids: number[]): number[] {
  for (const id of ids) if (id < 0) throw bad(`Token id ${id} is out of vocabulary`, "prompt");
  return ids;
}

/**
 * vLLM's `--scheduling-policy`: with `fcfs` (vLLM's default) a non-zero `priority` is a 400; with
 * `priority` it is accepted (lower is served earlier).
 */
export type SchedulingPolicy = "fcfs" | "priority";

/**
 * Validates a body. @throws EngineError (400) with vLLM-like messages.
 * `maxModelLen` is not used here (the prompt-length check needs the tokens).
 */
export function parseCompletionRequest(
  body: unknown,
  headerRequestId: string | null,
  schedulingPolicy: SchedulingPolicy = "fcfs",
): CompletionRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw bad("1 validation error for CompletionRequest\n  Input should be a valid dictionary or object");
  }
  const b = body as Body;
  const model = b.model;
  if (model !== undefined && model !== null && typeof model !== "string")
    throw typeError("model", "a valid string", model);
  const prompts = parsePrompt(b.prompt);
  const stream = optBool(b, "stream") ?? false;
  const so = b.stream_options;
  if (so !== undefined && so !== null && (typeof so !== "object" || Array.isArray(so))) {
    throw typeError("stream_options", "a valid dictionary", so);
  }
  const soObj = (so ?? null) as Body | null;
  if (soObj && !stream) throw bad("Stream options can only be defined when `stream=True`.", "stream_options");
  const includeUsage = soObj ? (optBool(soObj, "include_usage") ?? false) : false;
  const continuousUsage = soObj ? (optBool(soObj, "continuous_usage_stats") ?? false) : false;
  const promptLogprobs = optInt(b, "prompt_logprobs");
  if (promptLogprobs !== null && stream) {
    throw bad("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs");
  }
  const maxTokensGiven = optInt(b, "max_tokens");
  const n = optInt(b, "n") ?? 1;
  const temperature = optNumber(b, "temperature") ?? 1.0;
  const topP = optNumber(b, "top_p") ?? 1.0;
  const topK = optInt(b, "top_k") ?? 0;
  const minP = optNumber(b, "min_p") ?? 0;
  const repetitionPenalty = optNumber(b, "repetition_penalty") ?? 1.0;
  const presencePenalty = optNumber(b, "presence_penalty") ?? 0;
  const frequencyPenalty = optNumber(b, "frequency_penalty") ?? 0;
  const seed = optSeed(b);
  const minTokens = optInt(b, "min_tokens") ?? 0;
  const logprobs = optInt(b, "logprobs");
  let stop: string[] = [];
  if (typeof b.stop === "string") stop = [b.stop];
  else if (Array.isArray(b.stop)) {
    if (!b.stop.every((s) => typeof s === "string"))
      throw typeError("stop", "a valid string or list of strings", b.stop);
    stop = b.stop as string[];
  } else if (b.stop !== undefined && b.stop !== null)
    throw typeError("stop", "a valid string or list of strings", b.stop);
  const stopTokenIds = optIntList(b, "stop_token_ids") ?? [];
  const allowedTokenIds = optIntList(b, "allowed_token_ids");
  const badWords = optStringList(b, "bad_words") ?? [];
  let logitBias: Map<number, number> | null = null;
  if (b.logit_bias !== undefined && b.logit_bias !== null) {
    if (typeof b.logit_bias !== "object" || Array.isArray(b.logit_bias)) {
      throw typeError("logit_bias", "a valid dictionary", b.logit_bias);
    }
    logitBias = new Map();
    for (const [k, v] of Object.entries(b.logit_bias as Body)) {
      const id = Number(k);
      if (!Number.isInteger(id) || typeof v !== "number" || !Number.isFinite(v)) {
        throw bad(`Invalid logit_bias entry ${JSON.stringify(k)}`, "logit_bias");
      }
      logitBias.set(id, Math.max(-100, Math.min(100, v)));
    }
  }
  const priority = optInt(b, "priority") ?? 0;
  if (priority !== 0 && schedulingPolicy !== "priority") {
    throw bad(`Got priority ${priority} but Priority scheduling is not enabled.`, "priority");
  }
  const requestIdField = b.request_id;
  if (requestIdField !== undefined && requestIdField !== null && typeof requestIdField !== "string") {
    throw typeError("request_id", "a valid string", requestIdField);
  }
  let xargs: Body = {};
  if (b.vllm_xargs !== undefined && b.vllm_xargs !== null) {
    if (typeof b.vllm_xargs !== "object" || Array.isArray(b.vllm_xargs)) {
      throw typeError("vllm_xargs", "a valid dictionary", b.vllm_xargs);
    }
    xargs = b.vllm_xargs as Body;
  }

  // SamplingParams._verify_args
  if (n < 1) throw bad(`n must be at least 1, got ${n}.`, "n");
  if (n > 256) throw bad(`n must be at most 256, got ${n}.`, "n");
  if (temperature < 0) throw bad(`temperature must be non-negative, got ${temperature}.`, "temperature");
  if (!(topP > 0 && topP <= 1)) throw bad(`top_p must be in (0, 1], got ${topP}.`, "top_p");
  if (topK < -1) throw bad(`top_k must be 0 (disable), -1 (disable), or at least 1, got ${topK}.`, "top_k");
  if (minP < 0 || minP > 1) throw bad(`min_p must be in [0, 1], got ${minP}.`, "min_p");
  if (!(repetitionPenalty > 0)) {
    throw bad(
      `repetition_penalty must be greater than zero, got ${repetitionPenalty}.`,
      "repetition_penalty",
    );
  }
  if (presencePenalty < -2 || presencePenalty > 2) {
    throw bad(`presence_penalty must be in [-2, 2], got ${presencePenalty}.`, "presence_penalty");
  }
  if (frequencyPenalty < -2 || frequencyPenalty > 2) {
    throw bad(`frequency_penalty must be in [-2, 2], got ${frequencyPenalty}.`, "frequency_penalty");
  }
  if (maxTokensGiven !== null && maxTokensGiven < 1) {
    throw bad(`max_tokens must be at least 1, got ${maxTokensGiven}.`, "max_tokens");
  }
  if (minTokens < 0)
    throw bad(`min_tokens must be greater than or equal to 0, got ${minTokens}.`, "min_tokens");
  if (maxTokensGiven !== null && minTokens > maxTokensGiven) {
    throw bad(
      `min_tokens must be less than or equal to max_tokens=${maxTokensGiven}, got ${minTokens}.`,
      "min_tokens",
    );
  }
  if (logprobs !== null && logprobs < 0)
    throw bad(`logprobs must be non-negative, got ${logprobs}.`, "logprobs");
  if (promptLogprobs !== null && promptLogprobs < 0) {
    throw bad(`prompt_logprobs must be non-negative, got ${promptLogprobs}.`, "prompt_logprobs");
  }
  if (stop.some((s) => s.length === 0)) throw bad("stop cannot contain an empty string.", "stop");
  if (n > 1 && temperature < GREEDY_EPS) throw bad(`n must be 1 when using greedy sampling, got ${n}.`, "n");
  if (stopTokenIds.some((id) => id < 0)) throw bad("stop_token_ids must be non-negative", "stop_token_ids");

  const params: SamplingParams = {
    n,
    temperature,
    topP,
    topK: Math.max(topK, 0),
    minP,
    repetitionPenalty,
    presencePenalty,
    frequencyPenalty,
    seed,
    maxTokens: maxTokensGiven ?? 16,
    minTokens,
    ignoreEos: optBool(b, "ignore_eos") ?? false,
    stop,
    stopTokenIds,
    includeStopStrInOutput: optBool(b, "include_stop_str_in_output") ?? false,
    logprobs,
    promptLogprobs,
    skipSpecialTokens: optBool(b, "skip_special_tokens") ?? true,
    logitBias,
    allowedTokenIds,
    badWords,
  };
  optBool(b, "spaces_between_special_tokens");
  return {
    model: typeof model === "string" ? model : null,
    prompts,
    params,
    maxTokensGiven,
    stream,
    includeUsage,
    continuousUsage,
    echo: optBool(b, "echo") ?? false,
    addSpecialTokens: optBool(b, "add_special_tokens") ?? true,
    returnTokenIds: optBool(b, "return_token_ids") ?? false,
    requestId: headerRequestId ?? (typeof requestIdField === "string" ? requestIdField : null),
    outputResidualStream: xargs.output_residual_stream,
    applySteeringVectors: xargs.apply_steering_vectors,
  };
}
