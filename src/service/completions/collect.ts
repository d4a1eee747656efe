// A non-streamed completion assembled from Inference's stream: per choice index, text appended,
// logprobs rows and token ids concatenated, the finish and stop reason of the choice's last chunk.
import { create } from "@bufbuild/protobuf";
import {
  type CompletionChoice,
  type CreateCompletionRequest,
  type CreateCompletionResponse,
  FinishReason,
  LogprobsSchema,
  type StreamCompletionResponse,
} from "../../../gen/acs/v1/completions_pb.js";
import type { InferenceRequest } from "../../upstream/index.js";
import type { UsageMeter } from "../usage-meter.js";
import type { Prepared } from "./call-types.js";
import { completionIds, meteredChunk, upstreamStream } from "./inference-calls.js";
import { countedUsage } from "./usage.js";

/** The choice of `index` among `choices` (each index once), or undefined. */
function choiceOfIndex(choices: readonly CompletionChoice[], index: number): CompletionChoice | undefined {
  const guess = choices[index]; // Inference's choices come in index order: the usual place
  if (guess !== undefined && guess.index === index) return guess;
  for (const c of choices) if (c.index === index) return c;
  return undefined;
}

/**
 * The first piece of a collected choice, made its accumulator: as a fresh choice with the piece
 * merged into it — the piece's text, logprobs, token ids and prompt token ids; its finish and stop
 * reason only when it finished; no prompt_logprobs (a collected stream has none).
 */
function firstPiece(piece: CompletionChoice): CompletionChoice {
  if (piece.finishReason === FinishReason.UNSPECIFIED && piece.stopReason.case !== undefined) {
    piece.stopReason = { case: undefined };
  }
  if (piece.promptLogprobs.length > 0) piece.promptLogprobs = [];
  return piece;
}

/** Appends every item of `items` to `to` (no argument spread: a long list cannot overflow the stack). */
function appendAll<T>(to: T[], items: readonly T[]): void {
  for (let i = 0; i < items.length; i++) to.push(items[i] as T);
}

/** `choices` in ascending index order (sorted in place when they are not). */
function sortedByIndex(choices: CompletionChoice[]): CompletionChoice[] {
  for (let i = 1; i < choices.length; i++) {
    if ((choices[i] as CompletionChoice).index < (choices[i - 1] as CompletionChoice).index) {
      return choices.sort((a, b) => a.index - b.index);
    }
  }
  return choices;
}

/** Adds one chunk's pieces to the collected `choices` (in the order each index first came). */
function addPieces(choices: CompletionChoice[], chunk: StreamCompletionResponse): void {
  for (const piece of chunk.choices) {
    const choice = choiceOfIndex(choices, piece.index);
    if (choice === undefined) {
      choices.push(firstPiece(piece));
      continue;
    }
    choice.text += piece.text;
    if (piece.logprobs !== undefined) {
      if (choice.logprobs === undefined) choice.logprobs = create(LogprobsSchema);
      appendAll(choice.logprobs.content, piece.logprobs.content);
    }
    if (piece.promptTokenIds.length > 0) choice.promptTokenIds = piece.promptTokenIds;
    appendAll(choice.tokenIds, piece.tokenIds);
    if (piece.finishReason !== FinishReason.UNSPECIFIED) {
      choice.finishReason = piece.finishReason;
      choice.stopReason = piece.stopReason;
    }
  }
}

/** The signals one upstream request of a non-streamed call runs under. */
export interface PartSignals {
  /**
   * Its Inference request's: the call's deadline's (the caller's abort or the deadline,
   * ./call-deadline.ts), a fan-out part's (aborted too when another part fails).
   */
  readonly signal: AbortSignal;
  /**
   * The gateway's count of its usage once Inference answered (`/tokenize`, when Inference reported
   * none): the caller's for one request (Inference answered within the deadline), a part's own
   * `signal` in a fan-out (the whole answer is not there yet).
   */
  readonly countSignal: AbortSignal;
}

/** One upstream request of a non-streamed call: what is sent, under which signals, metered where. */
export interface PartCall {
  readonly prepared: Prepared;
  /** The request sent to Inference (the call's, or its fan-out part's). */
  readonly body: InferenceRequest;
  readonly request: CreateCompletionRequest;
  readonly signals: PartSignals;
  readonly meter: UsageMeter;
  /** Its part in the meter: 0 without a fan-out. */
  readonly part: number;
}

/**
 * A non-streamed completion of `body` from Inference's stream, collected: the tokens generated so
 * far are known at every moment, so a caller who goes away or the deadline (`signals.signal`) is
 * charged exactly what was generated (vLLM reports no usage for an aborted non-streamed request).
 * Choices are assembled per index (text, logprobs rows, token ids, finish and stop reason of the
 * last chunk).
 */
export async function collectStream(call: PartCall): Promise<CreateCompletionResponse> {
  const { prepared, body, request, signals, meter, part } = call;
  const ids = completionIds(request.model);
  // The choices in the order they first came; each is the first piece of its index (a fresh
  // message of this stream's only), the later pieces appended to it.
  const choices: CompletionChoice[] = [];
  let usage: CreateCompletionResponse["usage"];
  // The caller has seen nothing yet: a failover after chunks starts the answer over.
  const onRestart = (): void => {
    choices.length = 0;
    usage = undefined;
    meter.restart(part);
  };
  const stream = { body, ids, continuousUsage: false, onRestart };
  const upstream = upstreamStream(prepared, stream, signals.signal, meter, part);
  for await (const upstreamChunk of { [Symbol.asyncIterator]: () => upstream }) {
    const chunk = meteredChunk(prepared, upstreamChunk, meter, part);
    if (chunk.choices.length === 0 && chunk.usage !== undefined) usage = chunk.usage;
    addPieces(choices, chunk);
  }
  const sorted = sortedByIndex(choices);
  if (request.returnTokenIds !== true) {
    for (const c of sorted) {
      c.tokenIds = [];
      c.promptTokenIds = [];
    }
  }
  // As create(CreateCompletionResponseSchema, {...ids, choices, usage}) builds it (a proto3
  // message is a plain object; an unset message field is absent), without its reflection.
  const response: CreateCompletionResponse = {
    $typeName: "acs.v1.CreateCompletionResponse",
    id: ids.id,
    created: ids.created,
    model: ids.model,
    choices: sorted,
  };
  // Inference reported no usage: the gateway's own count, as charged.
  usage ??= await countedUsage(prepared, request, meter, part, signals.countSignal);
  if (usage !== undefined) response.usage = usage;
  return response;
}
