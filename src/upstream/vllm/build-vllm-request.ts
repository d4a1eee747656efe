import { Readable } from "node:stream";
import type { CreateCompletionRequest } from "../../../gen/acs/v1/completions_pb.js";
import { invalidRequest } from "../../core/errors/index.js";
import {
  isJsonText,
  type JsonText,
  type JsonTextPart,
  jsonStringOf,
  jsonText,
  jsonTextByteLength,
  jsonTextChunks,
  jsonTextToString,
} from "../../core/json-text/index.js";
import type { VllmCompletionRequest, VllmPrompt, VllmXargValue } from "./types.js";

/** What the service has decided before the request goes to Inference. */
export interface ResolvedCompletion {
  /** Inference's `--served-model-name` for the requested model or alias. */
  servedModelName: string;
  /** The final max_tokens (proto/API.md §3, after any Budget clamp): an integer ≥ 1. */
  maxTokens: number;
  /** Whether the upstream request streams (SSE). */
  stream: boolean;
  /**
   * vllm-lens (and other) extra args, already JSON text (a string, or a JsonText written in pieces);
   * sent only when non-empty.
   */
  vllmXargs: Record<string, VllmXargValue>;
}

/**
 * The vLLM body for a checked proto request. Every sampling value is explicit — the caller's, or
 * OpenAI's default, or the value that turns a vLLM feature off — because vLLM fills omitted ones
 * from the model's `generation_config.json` (src/upstream/vllm/VLLM.md):
 * temperature 1, top_p 1, top_k −1 (off; 0 from the caller is sent as −1 too, since vLLM before
 * ≈0.8 refuses 0 and every version takes −1), min_p 0, repetition_penalty 1, presence/frequency 0,
 * min_tokens 0, n 1, ignore_eos false, skip_special_tokens true, spaces_between_special_tokens
 * true, add_special_tokens true, include_stop_str_in_output false, echo false, return_token_ids
 * false, stop [] and stop_token_ids [].
 * Optional fields appear only when set: seed (exact int64), logprobs, prompt_logprobs, user,
 * bad_words (only when non-empty), priority (only when non-zero: vLLM refuses non-zero priority without
 * `--scheduling-policy priority`), vllm_xargs (only when non-empty). Streams always ask for
 * `include_usage: true` (the gateway counts usage); `continuous_usage_stats` as the caller asked.
 * The proto has no `apply_hooks`, so it can never be forwarded.
 *
 * Throws RangeError when `resolved.maxTokens` is not an integer ≥ 1 (a bug in the caller), and
 * ApiError 400 `invalid_request` (param `prompt`) when the request has no prompt.
 */
export function buildVllmRequest(
  req: CreateCompletionRequest,
  resolved: ResolvedCompletion,
): VllmCompletionRequest {
  if (!Number.isSafeInteger(resolved.maxTokens) || resolved.maxTokens < 1) {
    throw new RangeError(`max_tokens must be an integer ≥ 1, got ${resolved.maxTokens}`);
  }
  const topK = req.topK === undefined || req.topK === 0 ? -1 : req.topK;
  const body: VllmCompletionRequest = {
    model: resolved.servedModelName,
    prompt: promptOf(req),
    max_tokens: resolved.maxTokens,
    n: req.n ?? 1,
    temperature: req.temperature ?? 1,
    top_p: req.topP ?? 1,
    top_k: topK,
    min_p: req.minP ?? 0,
    repetition_penalty: req.repetitionPenalty ?? 1,
    presence_penalty: req.presencePenalty ?? 0,
    frequency_penalty: req.frequencyPenalty ?? 0,
    min_tokens: req.minTokens ?? 0,
    ignore_eos: req.ignoreEos ?? false,
    stop: [...req.stop],
    stop_token_ids: [...req.stopTokenIds],
    include_stop_str_in_output: req.includeStopStrInOutput ?? false,
    skip_special_tokens: req.skipSpecialTokens ?? true,
    spaces_between_special_tokens: req.spacesBetweenSpecialTokens ?? true,
    add_special_tokens: req.addSpecialTokens ?? true,
    echo: req.echo ?? false,
    return_token_ids: req.returnTokenIds ?? false,
    stream: resolved.stream,
  };
  if (resolved.stream) {
    body.stream_options = {
      include_usage: true,
      continuous_usage_stats: req.streamOptions?.continuousUsageStats ?? false,
    };
  }
  if (req.seed !== undefined) body.seed = req.seed;
  if (req.logprobs !== undefined) body.logprobs = req.logprobs;
  if (req.promptLogprobs !== undefined) body.prompt_logprobs = req.promptLogprobs;
  if (req.user !== undefined) body.user = req.user;
  if (req.badWords.length > 0) body.bad_words = [...req.badWords];
  if (req.priority !== undefined && req.priority !== 0) body.priority = req.priority;
  if (Object.keys(resolved.vllmXargs).length > 0) body.vllm_xargs = { ...resolved.vllmXargs };
  return body;
}

function promptOf(req: CreateCompletionRequest): VllmPrompt {
  switch (req.prompt.case) {
    case "text":
      return req.prompt.value;
    case "texts":
      return [...req.prompt.value.values];
    case "tokenIds":
      return [...req.prompt.value.values];
    case "tokenIdsList":
      return req.prompt.value.values.map((p) => [...p.values]);
    default:
      throw invalidRequest("prompt", "The prompt is required.");
  }
}

/**
 * The JSON text of a vLLM request body, as pieces: the fields in their order (JSON.stringify's),
 * then `vllm_xargs` — each value a JSON string holding its JSON text; a {@link JsonText} value is
 * doubly encoded piece by piece, its base64 left unwritten — then `seed`, written as an exact JSON
 * integer (a bigint, never through a double), so 2^63 − 1 and −2^63 reach Inference unchanged.
 */
export function vllmRequestJson(body: VllmCompletionRequest): JsonText {
  // Neither vllm_xargs nor seed (most requests): the fields alone, without copying the body.
  if (body.seed === undefined && body.vllm_xargs === undefined) return jsonText([JSON.stringify(body)]);
  const { seed, vllm_xargs: xargs, ...rest } = body;
  const fields = JSON.stringify(rest);
  const parts: JsonTextPart[] = [fields.slice(0, -1)];
  let comma = fields !== "{}";
  const field = (name: string): void => {
    parts.push(`${comma ? "," : ""}${JSON.stringify(name)}:`);
    comma = true;
  };
  if (xargs !== undefined) {
    field("vllm_xargs");
    parts.push("{");
    Object.entries(xargs).forEach(([name, value], i) => {
      parts.push(`${i > 0 ? "," : ""}${JSON.stringify(name)}:`);
      if (isJsonText(value)) parts.push(...jsonStringOf(value).parts);
      else parts.push(JSON.stringify(value));
    });
    parts.push("}");
  }
  if (seed !== undefined) {
    field("seed");
    parts.push(seed.toString());
  }
  parts.push("}");
  return jsonText(parts);
}

/** The JSON text of a vLLM request body as one string (see {@link vllmRequestJson}). */
export function serializeVllmRequest(body: VllmCompletionRequest): string {
  return jsonTextToString(vllmRequestJson(body));
}

/** A request body for undici: the text, or a stream of it, and its length in bytes. */
export interface VllmRequestBody {
  /** The whole JSON text, or — when it holds base64 pieces — a fresh stream that writes it. */
  readonly body: string | Readable;
  /** UTF-8 bytes of the JSON text (sent as Content-Length). */
  readonly contentLength: number;
}

/**
 * The body to send for `body`: one string when it is all literal JSON; otherwise a stream that
 * writes the JSON around each tensor and the tensor's base64 in pieces of at most 64 KiB straight
 * from its bytes, so a steering vector of 32 MiB never becomes a 45 MB string (nor three of them),
 * and a slow reader holds up the writing (backpressure) instead of buffering it. A fresh stream on
 * every call, so a body can be sent again.
 */
export function vllmRequestBody(body: VllmCompletionRequest): VllmRequestBody {
  const json = vllmRequestJson(body);
  const contentLength = jsonTextByteLength(json);
  const only = json.parts[0];
  if (typeof only === "string" && json.parts.length === 1) return { body: only, contentLength };
  return {
    body: Readable.from(jsonTextChunks(json), { objectMode: false, highWaterMark: 64 * 1024 }),
    contentLength,
  };
}
