// The checks of a completion request that need no Inference call, one function per rule of the
// contract (proto/API.md §3, §4). The service runs them in the contract's order (see
// completions/check-order.ts); each has unit tests of its own (test/service/checks.test.ts).
import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import { limits } from "../config/index.js";
import { ApiError, invalidRequest } from "../core/errors/index.js";

/** How many prompts and choices a request asks for. */
export interface RequestShape {
  /** Prompts in the request: a string or one token list is 1. */
  readonly prompts: number;
  /** Choices per prompt (`n`, default 1). */
  readonly n: number;
}

/** The prompts × n of a request (before any check; an absent prompt counts 0). */
export function requestShape(request: CreateCompletionRequest): RequestShape {
  const p = request.prompt;
  let prompts = 0;
  if (p.case === "text" || p.case === "tokenIds") prompts = 1;
  else if (p.case === "texts" || p.case === "tokenIdsList") prompts = p.value.values.length;
  return { prompts, n: request.n ?? 1 };
}

/**
 * Most prompts a request can have: each asks for at least one token (n ≥ 1, max_tokens ≥ 1), so
 * more than this can never pass the §3 size cap, whatever n and max_tokens are.
 */
export const maxPromptsPerRequest = limits.maxGeneratedTokens;

/**
 * §3 size cap, for a prompt list longer than it can ever allow: the refusal of the JSON parsers
 * (src/surfaces/rest `PROMPT_LIST_CAP`, src/surfaces/rpc `PROTO_PROMPT_LIST_CAPS`), given as soon as the list's
 * item {@link maxPromptsPerRequest} + 1 is read, before the rest of the body is decoded; of the
 * binary bodies' wire count (src/surfaces/rpc/prompt-list-wire-count.ts), before protobuf-es decodes
 * them; and of {@link checkPromptCount} for a compressed binary message. ApiError 400 `invalid_request`, param
 * `max_tokens` (the size cap's).
 */
export function tooManyPrompts(): ApiError {
  return invalidRequest(
    "max_tokens",
    `At most ${limits.maxGeneratedTokens} generated tokens in all: a request with more than ${maxPromptsPerRequest} prompts asks for more, whatever n and max_tokens are (at least 1 each).`,
  );
}

/** {@link tooManyPrompts} for a decoded request (a compressed binary message: decoded before any check). */
export function checkPromptCount(shape: RequestShape): void {
  if (shape.prompts > maxPromptsPerRequest) throw tooManyPrompts();
}

/**
 * §4: `stream_options` only with `stream: true`; `prompt_logprobs` only without. Throws ApiError
 * 400 `invalid_request` with param `stream_options` or `prompt_logprobs`.
 */
export function checkStreamOnlyFields(request: CreateCompletionRequest, stream: boolean): void {
  if (!stream && request.streamOptions !== undefined) {
    throw invalidRequest("stream_options", "stream_options is only allowed when stream is true.");
  }
  if (stream && request.promptLogprobs !== undefined) {
    throw invalidRequest("prompt_logprobs", "prompt_logprobs is not available when stream is true.");
  }
}

/**
 * §3: a request with more than one prompt, or with n above 1, must set max_tokens. Throws ApiError
 * 400 `invalid_request`, param `max_tokens`.
 */
export function checkMaxTokensGiven(request: CreateCompletionRequest, shape: RequestShape): void {
  if (request.maxTokens === undefined && (shape.prompts > 1 || shape.n > 1)) {
    throw invalidRequest(
      "max_tokens",
      "max_tokens must be set when a request has more than one prompt or n above 1.",
    );
  }
}

/**
 * §3 size cap: prompts × n × max_tokens ≤ 32,000 (for an explicit max_tokens; the default is
 * within it by construction). Throws ApiError 400 `invalid_request`, param `max_tokens`, e.g.
 * `At most 32000 generated tokens in all: n = 2 times max_tokens = 16001 for each of 1 prompts is 32002.`
 */
export function checkGeneratedTokensCap(request: CreateCompletionRequest, shape: RequestShape): void {
  if (request.maxTokens === undefined) return;
  const total = shape.prompts * shape.n * request.maxTokens;
  if (total > limits.maxGeneratedTokens) {
    throw invalidRequest(
      "max_tokens",
      `At most ${limits.maxGeneratedTokens} generated tokens in all: n = ${shape.n} times max_tokens = ${request.maxTokens} for each of ${shape.prompts} prompts is ${total}.`,
    );
  }
}

/**
 * §3: without `stream`, max_tokens above 15,600 cannot be written within the API's 14-minute
 * wait. Throws ApiError 400 `deadline_infeasible`, param `max_tokens`.
 */
export function checkDeadlineFeasible(request: CreateCompletionRequest, stream: boolean): void {
  if (stream || request.maxTokens === undefined || request.maxTokens <= limits.maxNonStreamTokens) return;
  throw new ApiError(
    "deadline_infeasible",
    `max_tokens = ${request.maxTokens} cannot be written within the API's 14-minute wait for a request without stream: send stream: true, or at most ${limits.maxNonStreamTokens} max_tokens.`,
    { param: "max_tokens" },
  );
}

/**
 * §3: max_tokens as asked, or when left out the model's max_model_len less the longest prompt's
 * tokens, at least 1, at most 32,000 (15,600 without `stream`). Tokens.
 */
export function resolveMaxTokens(
  request: CreateCompletionRequest,
  maxModelLen: number,
  promptLengths: readonly number[],
  stream: boolean,
): number {
  if (request.maxTokens !== undefined) return request.maxTokens;
  const cap = stream ? limits.maxGeneratedTokens : limits.maxNonStreamTokens;
  return Math.max(1, Math.min(maxModelLen - Math.max(...promptLengths), cap));
}

/**
 * §3 prompt length: each prompt's tokens plus max_tokens must fit max_model_len. Throws ApiError
 * 400 `context_length_exceeded`, param `prompt` (naming the prompt's index when there are several).
 */
export function checkContextLength(
  maxModelLen: number,
  promptLengths: readonly number[],
  maxTokens: number,
): void {
  promptLengths.forEach((len, i) => {
    if (len + maxTokens <= maxModelLen) return;
    const which = promptLengths.length > 1 ? ` (prompt ${i})` : "";
    throw new ApiError(
      "context_length_exceeded",
      `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${len + maxTokens} tokens (${len} in your prompt${which}; ${maxTokens} for the completion). Please reduce your prompt; or completion length.`,
      { param: "prompt" },
    );
  });
}

/**
 * min_tokens ≤ max_tokens once max_tokens is known (an explicit max_tokens is checked earlier by
 * protovalidate; this covers the §3 default). Throws ApiError 400 `invalid_request`, param
 * `min_tokens`.
 */
export function checkMinTokens(request: CreateCompletionRequest, maxTokens: number): void {
  if (request.minTokens !== undefined && request.minTokens > maxTokens) {
    throw invalidRequest(
      "min_tokens",
      `Invalid value for 'min_tokens': must be at most max_tokens (${maxTokens}).`,
    );
  }
}
