import {
  type CompletionChoice,
  type CreateCompletionResponse,
  FinishReason,
  type ListModelsResponse,
  type Logprobs,
  type Model,
  type PromptPositionLogprobs,
  type StreamCompletionResponse,
  type Usage,
} from "../../../gen/acs/v1/completions_pb.js";
import type { Activations } from "../../../gen/acs/v1/lens_pb.js";
import { tensorToVllmLensJson, type VllmLensTensorJson } from "../../lens/index.js";

/** OpenAI's column-wise completions logprobs. */
export interface LogprobsJson {
  tokens: string[];
  /** null for the first echoed prompt token. */
  token_logprobs: (number | null)[];
  /** token → logprob of the top candidates; null for the first echoed prompt token. */
  top_logprobs: (Record<string, number> | null)[];
  /** Character offset of each token in the choice's text. */
  text_offset: number[];
}

/** vLLM's prompt logprobs: per position, token id (as a key) → candidate; first position null. */
export type PromptLogprobsJson = (Record<
  string,
  { logprob: number; rank: number; decoded_token: string }
> | null)[];

/**
 * A choice of a non-streamed completion, with every key vLLM's `CompletionResponseChoice` writes
 * (openai-node `CompletionChoice` plus vLLM's); a key whose option was not asked for is null.
 */
export interface CompletionChoiceJson {
  index: number;
  text: string;
  logprobs: LogprobsJson | null;
  finish_reason: "stop" | "length" | null;
  /** The stop string, the stop token id, or null (EOS, length, or not finished). */
  stop_reason: string | number | null;
  /** With return_token_ids; else null. */
  token_ids: number[] | null;
  /** With prompt_logprobs; else null. */
  prompt_logprobs: PromptLogprobsJson | null;
  /** With return_token_ids; else null. */
  prompt_token_ids: number[] | null;
  /** A lens fan-out's capture (proto/API.md §6: several prompts or n > 1): this choice's own. */
  activations?: ActivationsJson;
}

/** A choice of a stream chunk, with every key vLLM's `CompletionResponseStreamChoice` writes. */
export interface CompletionStreamChoiceJson {
  index: number;
  /** The next text of the choice (may be ""). */
  text: string;
  logprobs: LogprobsJson | null;
  /** Null until the choice's last chunk. */
  finish_reason: "stop" | "length" | null;
  stop_reason: string | number | null;
  /** With return_token_ids, on the first chunk of each choice; else null. */
  prompt_token_ids: number[] | null;
  /** With return_token_ids, the ids of this chunk's tokens; else null. */
  token_ids: number[] | null;
  /**
   * A lens fan-out's capture (proto/API.md §6): only in the choice's activations chunk, sent right
   * after its last text chunk (`text: ""`, every other key null).
   */
  activations?: ActivationsJson;
}

/** Token counts; `prompt_tokens_details` is null where vLLM writes it (it has no cached-token count here). */
export interface UsageJson {
  prompt_tokens: number;
  total_tokens: number;
  completion_tokens: number;
  prompt_tokens_details?: null;
}

export interface ActivationsJson {
  residual_stream: VllmLensTensorJson;
}

/**
 * `object: "text_completion"` with every key of vLLM's `CompletionResponse` (so clients written
 * for vLLM, and openai-node's `Completion`, read it unchanged), plus `activations` (vllm-lens).
 */
export interface CompletionJson {
  id: string;
  object: "text_completion";
  /** Unix seconds. */
  created: number;
  model: string;
  choices: CompletionChoiceJson[];
  /** Always null. */
  service_tier: null;
  /** Always null. */
  system_fingerprint: null;
  usage: UsageJson | null;
  /** vLLM's disaggregated-serving parameters: always null. */
  kv_transfer_params: null;
  /** Only when output_residual_stream was asked for. */
  activations?: ActivationsJson;
}

/**
 * One SSE chunk, with every key of vLLM's `CompletionStreamResponse`: `usage` is null on every
 * chunk but the usage chunk (and, with continuous_usage_stats, the text chunks).
 */
export interface CompletionChunkJson {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: CompletionStreamChoiceJson[];
  usage: UsageJson | null;
  /** Only on the activations chunk. */
  activations?: ActivationsJson;
}

/** A model of `GET /v1/models` (OpenAI's model object plus the gateway's facts). */
export interface ModelJson {
  id: string;
  object: "model";
  /** Unix seconds. */
  created: number;
  owned_by: string;
  /** The model this name stands for (its id; vLLM's `root`). */
  root: string;
  /** Longest prompt + completion, in tokens. */
  max_model_len: number;
  /** Other names the model answers to (e.g. `llama-8b`). */
  aliases: string[];
  /** Residual stream width. */
  hidden_size: number;
  /** Decoder layers. */
  num_hidden_layers: number;
}

export interface ModelListJson {
  object: "list";
  data: ModelJson[];
}

function renderLogprobs(logprobs: Logprobs | undefined): LogprobsJson | null {
  if (logprobs === undefined) return null;
  const columns: LogprobsJson = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const row of logprobs.content) {
    columns.tokens.push(row.token);
    columns.token_logprobs.push(row.logprob ?? null);
    if (row.topLogprobs === undefined) {
      columns.top_logprobs.push(null);
    } else {
      // A token may be any string ("__proto__" included): a null-prototype dict keeps it a key.
      const top: Record<string, number> = Object.create(null);
      for (const candidate of row.topLogprobs.values) top[candidate.token] = candidate.logprob;
      columns.top_logprobs.push(top);
    }
    columns.text_offset.push(row.textOffset);
  }
  return columns;
}

function renderPromptLogprobs(positions: PromptPositionLogprobs[]): PromptLogprobsJson {
  return positions.map((position) => {
    if (position.values.length === 0) return null;
    const candidates: NonNullable<PromptLogprobsJson[number]> = {};
    for (const c of position.values) {
      candidates[String(c.tokenId)] = { logprob: c.logprob, rank: c.rank, decoded_token: c.decodedToken };
    }
    return candidates;
  });
}

function renderFinishReason(reason: FinishReason): CompletionChoiceJson["finish_reason"] {
  switch (reason) {
    case FinishReason.STOP:
      return "stop";
    case FinishReason.LENGTH:
      return "length";
    default:
      return null;
  }
}

/** What the caller asked for that decides whether a key is null. */
export interface RenderOptions {
  /** `return_token_ids`: `prompt_token_ids` and `token_ids` are lists, not null. */
  readonly returnTokenIds: boolean;
}

function renderChoice(choice: CompletionChoice, opts: RenderOptions): CompletionChoiceJson {
  const json: CompletionChoiceJson = {
    index: choice.index,
    text: choice.text,
    logprobs: renderLogprobs(choice.logprobs),
    finish_reason: renderFinishReason(choice.finishReason),
    stop_reason: renderStopReason(choice),
    token_ids: opts.returnTokenIds ? [...choice.tokenIds] : null,
    prompt_logprobs: choice.promptLogprobs.length > 0 ? renderPromptLogprobs(choice.promptLogprobs) : null,
    prompt_token_ids: opts.returnTokenIds ? [...choice.promptTokenIds] : null,
  };
  const activations = renderActivations(choice.activations);
  if (activations !== undefined) json.activations = activations;
  return json;
}

function renderStreamChoice(choice: CompletionChoice, opts: RenderOptions): CompletionStreamChoiceJson {
  const activations = renderActivations(choice.activations);
  if (activations !== undefined) {
    // A fan-out choice's activations chunk: no text, no token ids (even with return_token_ids).
    return {
      index: choice.index,
      text: "",
      logprobs: null,
      finish_reason: null,
      stop_reason: null,
      prompt_token_ids: null,
      token_ids: null,
      activations,
    };
  }
  return {
    index: choice.index,
    text: choice.text,
    logprobs: renderLogprobs(choice.logprobs),
    finish_reason: renderFinishReason(choice.finishReason),
    stop_reason: renderStopReason(choice),
    // As vLLM: the prompt's ids on the first chunk of a choice only.
    prompt_token_ids:
      opts.returnTokenIds && choice.promptTokenIds.length > 0 ? [...choice.promptTokenIds] : null,
    token_ids: opts.returnTokenIds ? [...choice.tokenIds] : null,
  };
}

function renderStopReason(choice: CompletionChoice): string | number | null {
  return choice.stopReason.case === undefined ? null : choice.stopReason.value;
}

/** Usage as vLLM writes it: with `prompt_tokens_details: null`, except on the usage chunk (vLLM drops nulls there). */
function renderUsage(usage: Usage, details: boolean): UsageJson {
  const json: UsageJson = {
    prompt_tokens: usage.promptTokens,
    total_tokens: usage.totalTokens,
    completion_tokens: usage.completionTokens,
  };
  if (details) json.prompt_tokens_details = null;
  return json;
}

function renderActivations(activations: Activations | undefined): ActivationsJson | undefined {
  if (activations?.residualStream === undefined) return undefined;
  return { residual_stream: tensorToVllmLensJson(activations.residualStream) };
}

/**
 * A whole completion in OpenAI's JSON (`object: "text_completion"`, proto/API.md §5), with every key
 * vLLM writes: `created` becomes a number (Unix seconds); a choice's `logprobs` is column-wise or
 * null; `prompt_logprobs` is null unless asked for, `prompt_token_ids`/`token_ids` null without
 * return_token_ids; `service_tier`, `system_fingerprint` and `kv_transfer_params` are null;
 * `activations` appears only when asked for. `usage` is null only if the proto has none.
 */
export function renderCompletion(res: CreateCompletionResponse, opts: RenderOptions): CompletionJson {
  const json: CompletionJson = {
    id: res.id,
    object: "text_completion",
    created: Number(res.created),
    model: res.model,
    choices: res.choices.map((c) => renderChoice(c, opts)),
    service_tier: null,
    system_fingerprint: null,
    usage: res.usage === undefined ? null : renderUsage(res.usage, true),
    kv_transfer_params: null,
  };
  const activations = renderActivations(res.activations);
  if (activations !== undefined) json.activations = activations;
  return json;
}

/**
 * One chunk of a stream in OpenAI's JSON (proto/API.md §5), with every key vLLM writes: the next text of
 * one choice (finish_reason/stop_reason null until its last chunk; `usage` null, or the usage so
 * far with continuous_usage_stats), the usage chunk (`choices: []`), or the activations chunk
 * (`choices: []`, `activations`; `usage` null, or the usage so far of the choice with continuous_usage_stats).
 */
export function renderChunk(chunk: StreamCompletionResponse, opts: RenderOptions): CompletionChunkJson {
  const usageChunk = chunk.choices.length === 0 && chunk.activations === undefined;
  const json: CompletionChunkJson = {
    id: chunk.id,
    object: "text_completion",
    created: Number(chunk.created),
    model: chunk.model,
    choices: chunk.choices.map((c) => renderStreamChoice(c, opts)),
    usage: chunk.usage === undefined ? null : renderUsage(chunk.usage, !usageChunk),
  };
  const activations = renderActivations(chunk.activations);
  if (activations !== undefined) json.activations = activations;
  return json;
}

/** A model object of `GET /v1/models/{id}`, named `name` (the id or an alias). `created` in Unix seconds. */
export function renderModel(model: Model, name: string = model.id): ModelJson {
  return {
    id: name,
    object: "model",
    created: Number(model.created),
    owned_by: model.ownedBy,
    root: model.id,
    max_model_len: model.maxModelLen,
    aliases: [...model.aliases],
    hidden_size: model.hiddenSize,
    num_hidden_layers: model.numHiddenLayers,
  };
}

/**
 * `GET /v1/models`: `{object: "list", data: [model, …]}`, one entry for every name a request may
 * use as `model` — the id, then each alias (`root` names the model an alias stands for, as vLLM's
 * model cards do).
 */
export function renderModelList(res: ListModelsResponse): ModelListJson {
  return {
    object: "list",
    data: res.data.flatMap((m) => [m.id, ...m.aliases].map((name) => renderModel(m, name))),
  };
}
