// CreateCompletion: one prepared call answered whole — Inference's stream collected, or its
// non-streamed answer (prompt_logprobs, captures), or a lens fan-out's parts merged.
import { create } from "@bufbuild/protobuf";
import {
  type CompletionChoice,
  type CreateCompletionRequest,
  type CreateCompletionResponse,
  CreateCompletionResponseSchema,
  type Usage,
} from "../../../gen/acs/v1/completions_pb.js";
import { ApiError, toApiError } from "../../core/errors/index.js";
import type { FanOutPart } from "../lens-fan-out.js";
import { mergeLimited } from "../lens-fan-out.js";
import type { CallContext } from "../types.js";
import type { UsageMeter } from "../usage-meter.js";
import type { CallDeadline } from "./call-deadline.js";
import { recordError } from "./call-record.js";
import type { Prepared, RunningCall } from "./call-types.js";
import { collectStream, type PartCall } from "./collect.js";
import { holdStands } from "./hold.js";
import { completionIds, inferenceCall } from "./inference-calls.js";
import { begin, partsAtOnce } from "./prepare.js";
import type { ServiceEnv } from "./service-env.js";
import { countedUsage, sumUsage } from "./usage.js";

/**
 * A non-streamed completion of `body` from Inference's non-streamed answer: the one place
 * prompt_logprobs and activations exist (a capture's are set at the top level). Its tokens are
 * unknown until Inference answers.
 */
async function completeUnary(call: PartCall): Promise<CreateCompletionResponse> {
  const { prepared, body, request, signals, meter, part } = call;
  const { signal } = signals;
  meter.markUncounted(part);
  const answer = await prepared.model.client.complete(body, request.model, inferenceCall(prepared, signal));
  const response = answer.response;
  for (const c of response.choices) {
    meter.addGenerated(c.tokenIds.length, part);
    // Bounded prompts become exact here, as from a stream's first chunk: the access log and the
    // prompt-token metrics count Inference's tokens, and a prompt longer than its bound is seen.
    if (c.promptTokenIds.length > 0) meter.notePromptTokens(c.index, c.promptTokenIds.length);
  }
  // No first-token time: the whole answer came at once (the time to first token would be the
  // request's, and the time per output token ~0).
  if (response.usage !== undefined) meter.report(response.usage, part);
  // Inference reported no usage: the gateway's own count (its token ids), as charged.
  else {
    const usage = await countedUsage(prepared, request, meter, part, signals.countSignal);
    if (usage !== undefined) response.usage = usage;
  }
  if (request.returnTokenIds !== true) {
    for (const c of response.choices) {
      c.tokenIds = [];
      c.promptTokenIds = [];
    }
  }
  if (prepared.capture) response.activations = answer.activations();
  return response;
}

/**
 * One upstream request's whole completion: Inference's stream collected ({@link collectStream}),
 * keys on or off — so that a caller who goes away or the deadline is charged exactly what was
 * generated, and so that the upstream's first event comes after prefill: a silent replica is
 * found within the bound on it (`ACS_UPSTREAM_HEADERS_TIMEOUT_MS`; vLLM sends a non-streamed
 * answer's headers only at its end) and the call fails over, even after chunks. For
 * prompt_logprobs and activations (they exist only there), Inference's non-streamed answer
 * ({@link completeUnary}), bound by the deadline only. Both give the caller the same response,
 * but for the `text_offset` of a token whose string is not in the text (bytes of a split
 * character, a skipped special token): the whole text at once may put it earlier, both no later
 * than its bytes (ChoiceTextOffsets).
 */
function completeOne(call: PartCall): Promise<CreateCompletionResponse> {
  return call.request.promptLogprobs === undefined && !call.prepared.capture
    ? collectStream(call)
    : completeUnary(call);
}

/** A fan-out part's one choice, renumbered to its index, with its activations on the choice. */
function partChoice(part: FanOutPart, response: CreateCompletionResponse): CompletionChoice {
  const choice = response.choices[0];
  if (choice === undefined || response.choices.length !== 1) {
    throw new ApiError(
      "upstream_error",
      `Inference returned ${response.choices.length} choices for a request with n = 1.`,
    );
  }
  choice.index = part.index;
  if (response.activations !== undefined) choice.activations = response.activations;
  return choice;
}

/**
 * A lens fan-out's whole completion (proto/API.md §6): every part completed (at most
 * `fanOutConcurrency` at once) under the call's one deadline (`signal`), each part's one choice
 * renumbered to its index (with its activations on the choice), usage summed over the parts. The
 * first failure aborts the other parts and is thrown once they have ended.
 */
async function completeFanOut(
  env: ServiceEnv,
  prepared: Prepared,
  parts: readonly FanOutPart[],
  request: CreateCompletionRequest,
  signal: AbortSignal,
  meter: UsageMeter,
): Promise<CreateCompletionResponse> {
  const sources = parts.map(
    (part, i) =>
      async function* (partSignal: AbortSignal) {
        const signals = { signal: partSignal, countSignal: partSignal };
        yield {
          part,
          response: await completeOne({ prepared, body: part.body, request, signals, meter, part: i }),
        };
      },
  );
  const choices: CompletionChoice[] = [];
  const usages: Usage[] = [];
  for await (const { part, response } of mergeLimited(sources, partsAtOnce(env, prepared), signal)) {
    choices.push(partChoice(part, response));
    if (response.usage !== undefined) usages.push(response.usage);
  }
  choices.sort((a, b) => a.index - b.index);
  const usage = usages.length === parts.length ? sumUsage(usages) : undefined;
  return create(CreateCompletionResponseSchema, {
    ...completionIds(request.model),
    choices,
    ...(usage ? { usage } : {}),
  });
}

/**
 * The whole answer of a running call: its one request, or its fan-out's parts, under the call's
 * one deadline. Throws what they throw — the deadline's 504 `deadline_exceeded` when it passed
 * before the caller went away ({@link CallDeadline.failure}).
 */
async function answer(
  env: ServiceEnv,
  running: RunningCall,
  request: CreateCompletionRequest,
  ctx: CallContext,
): Promise<CreateCompletionResponse> {
  const { prepared, meter, signal, deadline } = running;
  try {
    return prepared.parts === undefined
      ? await completeOne({
          prepared,
          body: prepared.body,
          request,
          signals: { signal, countSignal: ctx.signal },
          meter,
          part: 0,
        })
      : await completeFanOut(env, prepared, prepared.parts, request, signal, meter);
  } catch (err) {
    throw deadline === undefined ? err : deadline.failure(err);
  }
}

/** CreateCompletion (proto/API.md §4): the checks, the whole answer, the one end. */
export async function createCompletion(
  env: ServiceEnv,
  request: CreateCompletionRequest,
  ctx: CallContext,
): Promise<CreateCompletionResponse> {
  const running = await begin(env, request, ctx, false);
  let failure: unknown;
  try {
    const response = await answer(env, running, request, ctx);
    const stands = holdStands(env, running.prepared.hold);
    if (stands !== true) await stands;
    return response;
  } catch (err) {
    failure = err;
    throw recordError(ctx, toApiError(err));
  } finally {
    await running.call.end(failure);
  }
}
