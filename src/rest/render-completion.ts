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
} from "../../gen/acs/v1/completions_pb.js";
import type { Activations } from "../../gen/acs/v1/lens_pb.js";
import { tensorToVllmLensJson, type VllmLensTensorJson } from "../lens/index.js";

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

/** A choice as OpenAI's and vLLM's completions return it (openai-node `CompletionChoice` plus vLLM). */
export interface CompletionChoiceJson {
  index: number;
  text: string;
  logprobs: LogprobsJson | null;
  finish_reason: "stop" | "length" | null;
  /** The stop string, the stop token id, or null (EOS, length, or not finished). */
  stop_reason: string | number | null;
  /** Only when prompt_logprobs was asked for. */
  prompt_logprobs?: PromptLogprobsJson;
  /** Only with return_token_ids. */
  prompt_token_ids?: number[];
  /** Only with return_token_ids (in a stream: the next ids). */
  token_ids?: number[];
}

export interface UsageJson {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface ActivationsJson {
  residual_stream: VllmLensTensorJson;
}

/** `object: "text_completion"` as openai-node's `Completion` parses it, plus `activations`. */
export interface CompletionJson {
  id: string;
  object: "text_completion";
  /** Unix seconds. */
  created: number;
  model: string;
  choices: CompletionChoiceJson[];
  usage: UsageJson | null;
  /** Only when output_residual_stream was asked for. */
  activations?: ActivationsJson;
}

/** One SSE chunk: like a completion; `usage` is present (null or counts) only with include_usage. */
export interface CompletionChunkJson {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: CompletionChoiceJson[];
  usage?: UsageJson | null;
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

function renderChoice(choice: CompletionChoice): CompletionChoiceJson {
  const json: CompletionChoiceJson = {
    index: choice.index,
    text: choice.text,
    logprobs: renderLogprobs(choice.logprobs),
    finish_reason: renderFinishReason(choice.finishReason),
    stop_reason: choice.stopReason.case === undefined ? null : choice.stopReason.value,
  };
  if (choice.promptLogprobs.length > 0) json.prompt_logprobs = renderPromptLogprobs(choice.promptLogprobs);
  if (choice.promptTokenIds.length > 0) json.prompt_token_ids = [...choice.promptTokenIds];
  if (choice.tokenIds.length > 0 || choice.promptTokenIds.length > 0) json.token_ids = [...choice.tokenIds];
  return json;
}

function renderUsage(usage: Usage): UsageJson {
  return {
    prompt_tokens: usage.promptTokens,
    completion_tokens: usage.completionTokens,
    total_tokens: usage.totalTokens,
  };
}

function renderActivations(activations: Activations | undefined): ActivationsJson | undefined {
  if (activations?.residualStream === undefined) return undefined;
  return { residual_stream: tensorToVllmLensJson(activations.residualStream) };
}

/**
 * A whole completion in OpenAI's JSON (`object: "text_completion"`, API.md §5).
 * `created` becomes a number (Unix seconds); a choice's `logprobs` is column-wise or null;
 * `prompt_logprobs`, `prompt_token_ids`/`token_ids` and `activations` appear only when the proto
 * carries them (i.e. when they were asked for). `usage` is null only if the proto has none.
 */
export function renderCompletion(res: CreateCompletionResponse): CompletionJson {
  const json: CompletionJson = {
    id: res.id,
    object: "text_completion",
    created: Number(res.created),
    model: res.model,
    choices: res.choices.map(renderChoice),
    usage: res.usage === undefined ? null : renderUsage(res.usage),
  };
  const activations = renderActivations(res.activations);
  if (activations !== undefined) json.activations = activations;
  return json;
}

/**
 * One chunk of a stream in OpenAI's JSON (API.md §5): the next text of one choice
 * (finish_reason/stop_reason null until its last chunk), the usage chunk (`choices: []`), or the
 * activations chunk (`choices: []`, `activations`).
 *
 * @param opts.includeUsage `stream_options.include_usage` was set: chunks without usage carry
 *   `usage: null` (as OpenAI sends them); without it, `usage` appears only on chunks that have one
 *   (`continuous_usage_stats`).
 */
export function renderChunk(
  chunk: StreamCompletionResponse,
  opts: { includeUsage: boolean },
): CompletionChunkJson {
  const json: CompletionChunkJson = {
    id: chunk.id,
    object: "text_completion",
    created: Number(chunk.created),
    model: chunk.model,
    choices: chunk.choices.map(renderChoice),
  };
  if (chunk.usage !== undefined) json.usage = renderUsage(chunk.usage);
  else if (opts.includeUsage) json.usage = null;
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
