import { create } from "@bufbuild/protobuf";
import {
  type CompletionChoice,
  type CreateCompletionResponse,
  FinishReason,
  type Logprobs,
  LogprobsSchema,
  type PromptPositionLogprobs,
  PromptPositionLogprobsSchema,
  type StreamCompletionResponse,
  type Usage,
} from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../core/errors/index.js";
import { newCompletionId } from "./ids.js";
import { orderedEntries } from "./parse-json-ordered.js";
import { TextOffsets } from "./text-offsets.js";
import type {
  VllmCompletion,
  VllmCompletionChoice,
  VllmCompletionChunk,
  VllmLogprobs,
  VllmPromptLogprobs,
  VllmUsage,
} from "./types.js";

/**
 * A non-streamed vLLM completion → the proto response. `model` is the model as the caller asked
 * for it (an alias stays an alias); the id is a fresh `cmpl-` + 32 hex (upstream ids never
 * leak); `created` is Inference's (Unix seconds). Each choice's `text_offset` is recomputed to
 * point into its own text ({@link ChoiceTextOffsets}; vLLM's are sums of token lengths).
 * `activations` is left unset: the service decodes `v.activations` with src/lens. Throws ApiError
 * 502 `upstream_error` when a choice ended with finish_reason `abort`.
 */
export function toCompletionResponse(v: VllmCompletion, model: string): CreateCompletionResponse {
  const choices = toChoices(v.choices, new TextOffsets());
  // As create(CreateCompletionResponseSchema, {...}) builds it (see toStreamChunk), without its
  // per-field reflection: this runs once per unary request.
  const response: CreateCompletionResponse = {
    $typeName: "acs.v1.CreateCompletionResponse",
    id: newCompletionId(),
    created: BigInt(v.created),
    model,
    choices,
  };
  if (v.usage !== null) response.usage = toUsage(v.usage);
  return response;
}

/**
 * One vLLM stream chunk → the proto chunk, with the gateway's `id`, `created` and `model` (the
 * same on every chunk of a stream). Choices carry the next text; finish_reason is UNSPECIFIED
 * until a choice's last chunk. `usage` is copied when the chunk has one (the upstream always
 * asks for `include_usage`: the service drops the usage chunk when the caller did not ask).
 * `offsets` is the stream's one {@link TextOffsets} (every chunk of a stream goes through the
 * same one): it follows the text of each choice with logprobs and gives `text_offset` that
 * point into it.
 * Throws ApiError 502 `upstream_error` for finish_reason `abort`.
 */
export function toStreamChunk(
  c: VllmCompletionChunk,
  ids: { id: string; created: bigint; model: string },
  offsets: TextOffsets,
): StreamCompletionResponse {
  // Built as `create(StreamCompletionResponseSchema, {...})` would build it (a proto3 message is a
  // plain object: `$typeName`, then each implicit-presence field in field order; an unset message
  // field is absent), without create()'s per-field reflection: this runs once per streamed chunk.
  const choices = toChoices(c.choices, offsets);
  const chunk: StreamCompletionResponse = {
    $typeName: "acs.v1.StreamCompletionResponse",
    id: ids.id,
    created: ids.created,
    model: ids.model,
    choices,
  };
  if (c.usage !== null) chunk.usage = toUsage(c.usage);
  return chunk;
}

/** Each vLLM choice → its proto choice, in order, through `offsets` (see {@link toChoice}). */
function toChoices(list: readonly VllmCompletionChoice[], offsets: TextOffsets): CompletionChoice[] {
  const n = list.length;
  const choices: CompletionChoice[] = new Array(n);
  for (let i = 0; i < n; i++) choices[i] = toChoice(list[i] as VllmCompletionChoice, offsets);
  return choices;
}

function toUsage(u: VllmUsage): Usage {
  return {
    $typeName: "acs.v1.Usage",
    promptTokens: u.prompt_tokens,
    completionTokens: u.completion_tokens,
    totalTokens: u.total_tokens,
  };
}

function finishReasonOf(c: VllmCompletionChoice): FinishReason {
  switch (c.finish_reason) {
    case null:
      return FinishReason.UNSPECIFIED;
    case "stop":
      return FinishReason.STOP;
    case "length":
      return FinishReason.LENGTH;
    case "abort":
      throw new ApiError("upstream_error", `Inference aborted choice ${c.index}.`);
  }
}

/** No stop reason (a shared value is never handed out: each choice gets its own object). */
function noStopReason(): CompletionChoice["stopReason"] {
  return { case: undefined };
}

function toChoice(c: VllmCompletionChoice, offsets: TextOffsets): CompletionChoice {
  const finishReason = finishReasonOf(c);
  const stopReason: CompletionChoice["stopReason"] =
    typeof c.stop_reason === "string"
      ? { case: "stopString", value: c.stop_reason }
      : typeof c.stop_reason === "number"
        ? { case: "stopTokenId", value: c.stop_reason }
        : noStopReason();
  // As create(CompletionChoiceSchema, {...}) builds it (see toStreamChunk), without reflection.
  const choice: CompletionChoice = {
    $typeName: "acs.v1.CompletionChoice",
    index: c.index,
    text: c.text,
    finishReason,
    stopReason,
    promptLogprobs: c.prompt_logprobs === null ? [] : toPromptLogprobs(c.prompt_logprobs),
    promptTokenIds: c.prompt_token_ids ?? [],
    tokenIds: c.token_ids ?? [],
  };
  // A choice's text is tracked only with logprobs, whose offsets point into it (vLLM sends
  // logprobs on every chunk of a request that asked for them, and on none otherwise).
  if (c.logprobs !== null)
    choice.logprobs = toLogprobs(
      c.logprobs,
      offsets.of(c.index).next(c.text, c.logprobs.tokens, c.finish_reason !== null),
    );
  return choice;
}

/**
 * OpenAI's column-wise logprobs → one proto row per token (columns are checked equal on parse),
 * with `textOffsets` in place of vLLM's `text_offset`.
 */
function toLogprobs(l: VllmLogprobs, textOffsets: readonly number[]): Logprobs {
  return create(LogprobsSchema, {
    content: l.tokens.map((token, i) => {
      const logprob = l.token_logprobs[i];
      const top = l.top_logprobs?.[i];
      return {
        token,
        ...(logprob === null || logprob === undefined ? {} : { logprob }),
        ...(top === null || top === undefined
          ? {}
          : { topLogprobs: { values: orderedEntries(top).map(([t, lp]) => ({ token: t, logprob: lp })) } }),
        textOffset: textOffsets[i] ?? 0,
      };
    }),
  });
}

/** vLLM prompt_logprobs → proto positions: `null` (the first) → empty; dict order kept. */
function toPromptLogprobs(p: VllmPromptLogprobs): PromptPositionLogprobs[] {
  return p.map((pos) =>
    create(PromptPositionLogprobsSchema, {
      values:
        pos === null
          ? []
          : orderedEntries(pos).map(([id, cand]) => ({
              tokenId: Number(id),
              logprob: cand.logprob,
              rank: cand.rank ?? 0,
              decodedToken: cand.decoded_token ?? "",
            })),
    }),
  );
}
