import type { JsonText } from "../../core/json-text/index.js";
// Wire types of Inference: vLLM's OpenAI-compatible HTTP API with the vllm-lens plugin
// (src/upstream/vllm/VLLM.md). These are vLLM's own JSON shapes (snake_case), not the proto messages.

/** The prompt in one of its four forms; token-id prompts get no BOS. */
export type VllmPrompt = string | string[] | number[] | number[][];

/** `stream_options` of a streamed completion (only sent with `stream: true`). */
export interface VllmStreamOptions {
  include_usage: boolean;
  continuous_usage_stats: boolean;
}

/**
 * Body of `POST /v1/completions` as the gateway sends it. Every sampling value is present, so
 * the model's `generation_config.json` never chooses one. `seed` is a bigint and must be written
 * with {@link serializeVllmRequest} (JSON.stringify cannot, and a double would round it).
 */
export interface VllmCompletionRequest {
  /** The served model name (`--served-model-name`), not the alias the caller used. */
  model: string;
  prompt: VllmPrompt;
  /** Always an integer (`null` is a 500 on vLLM 0.19). */
  max_tokens: number;
  n: number;
  temperature: number;
  top_p: number;
  /** −1 = off: accepted by every vLLM version (0 is refused before ≈0.8). */
  top_k: number;
  min_p: number;
  repetition_penalty: number;
  presence_penalty: number;
  frequency_penalty: number;
  min_tokens: number;
  ignore_eos: boolean;
  stop: string[];
  stop_token_ids: number[];
  include_stop_str_in_output: boolean;
  skip_special_tokens: boolean;
  spaces_between_special_tokens: boolean;
  add_special_tokens: boolean;
  echo: boolean;
  /** Adds `prompt_token_ids` and `token_ids` to each choice. */
  return_token_ids: boolean;
  stream: boolean;
  /** Present only with `stream: true` (vLLM refuses it otherwise). */
  stream_options?: VllmStreamOptions;
  /** int64, written exactly. */
  seed?: bigint;
  /** Top log probabilities per generated token, 0–20. */
  logprobs?: number;
  /** Not with streaming. */
  prompt_logprobs?: number;
  /** Only when non-zero (fails unless Inference runs `--scheduling-policy priority`). */
  priority?: number;
  user?: string;
  /** Words never generated (vLLM tokenizes them); only when non-empty. */
  bad_words?: string[];
  /**
   * SamplingParams.extra_args; vllm-lens fields as JSON strings. Only when non-empty. A value is a
   * string, or a {@link JsonText} (a large steering list whose tensors are written as base64
   * piece by piece when the body is sent); either is sent as a JSON string holding that JSON.
   */
  vllm_xargs?: Record<string, VllmXargValue>;
}

/** A vllm_xargs value: JSON text, sent as a JSON string (whole, or written in pieces). */
export type VllmXargValue = string | JsonText;

/** OpenAI's column-wise completion logprobs, as vLLM writes them. */
export interface VllmLogprobs {
  /** Character offset of each token in the choice's text. */
  text_offset: number[];
  /** `null` for the first echoed prompt token; −inf is clamped to −9999.0. */
  token_logprobs: (number | null)[];
  tokens: string[];
  /** Per position: decoded token → logprob, in vLLM's order; `null` for the first echoed token. */
  top_logprobs: (Record<string, number> | null)[] | null;
}

/** One candidate at a prompt position (vLLM `prompt_logprobs`). */
export interface VllmPromptLogprob {
  logprob: number;
  rank: number | null;
  decoded_token: string | null;
}

/** `prompt_logprobs`: first entry `null`, then per position `{ "<token id>": candidate }`. */
export type VllmPromptLogprobs = (Record<string, VllmPromptLogprob> | null)[];

/** Why a choice ended; `abort` means the engine dropped it. `null` until a stream choice ends. */
export type VllmFinishReason = "stop" | "length" | "abort";

/** A choice of a non-streamed completion, or the next part of one in a stream chunk. */
export interface VllmCompletionChoice {
  /** prompt_index × n + sample_index. */
  index: number;
  /** The text (a delta in a stream; may be `""`). */
  text: string;
  logprobs: VllmLogprobs | null;
  finish_reason: VllmFinishReason | null;
  /** A stop string, a stop token id (integer), or null (EOS / length / not finished). */
  stop_reason: string | number | null;
  prompt_logprobs: VllmPromptLogprobs | null;
  prompt_token_ids: number[] | null;
  token_ids: number[] | null;
}

/** Token counts: `prompt_tokens` counts each prompt once; `completion_tokens` all choices. */
export interface VllmUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/**
 * vllm-lens activations (non-streamed completions only, first prompt only). Left raw: each
 * value is the tensor dict `{data, dtype, original_dtype, shape, compression}` that src/lens
 * decodes.
 */
export interface VllmActivations {
  residual_stream?: unknown;
  [name: string]: unknown;
}

/** One `data:` event of a streamed completion: one choice, or `choices: []` with the usage. */
export interface VllmCompletionChunk {
  /** `cmpl-<X-Request-Id>`; never shown to callers. */
  id: string;
  object: string;
  /** Unix seconds. */
  created: number;
  model: string;
  choices: VllmCompletionChoice[];
  /**
   * A completion's usage; on a stream, set on the last chunk (`include_usage`), or on every chunk
   * (`continuous_usage_stats`).
   */
  usage: VllmUsage | null;
}

/** Response of a non-streamed `POST /v1/completions`: the fields of a chunk, plus activations. */
export interface VllmCompletion extends VllmCompletionChunk {
  /** Present when `output_residual_stream` was asked for (vllm-lens). */
  activations: VllmActivations | null;
}

/** The error object of vLLM ≥ 0.10.1 (`{"error": {...}}`) or the flat older form. */
export interface VllmErrorDetail {
  message: string;
  /** A Python class name such as `BadRequestError`; never shown to callers. */
  type: string | null;
  param: string | null;
  /** The HTTP status as an integer; never shown to callers. */
  code: number | null;
}

/** An entry of `GET /v1/models`. */
export interface VllmModel {
  id: string;
  object: string;
  /** Unix seconds. */
  created: number;
  owned_by: string;
  root: string | null;
  parent: string | null;
  /** Longest prompt + completion in tokens (absent on some versions). */
  max_model_len: number | null;
}

/** Response of `GET /v1/models`. */
export interface VllmModelList {
  object: string;
  data: VllmModel[];
}

/** Body of `POST /tokenize` as a caller asks it (`/tokenize` of the REST surface). */
export interface VllmTokenizeRequest {
  /** The served model name. */
  model: string;
  prompt: string;
  add_special_tokens: boolean;
  return_token_strs: boolean;
}

/** Response of `POST /tokenize`. */
export interface VllmTokenizeResponse {
  count: number;
  max_model_len: number;
  tokens: number[];
  /** Each token's string, when `return_token_strs` was asked for (else null or absent). */
  token_strs?: string[] | null;
}

/** Body of `POST /detokenize`. */
export interface VllmDetokenizeRequest {
  /** The served model name. */
  model: string;
  tokens: number[];
}

/** Response of `POST /detokenize`. */
export interface VllmDetokenizeResponse {
  prompt: string;
}
