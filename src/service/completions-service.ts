import { create } from "@bufbuild/protobuf";
import {
  type CompletionChoice,
  CompletionChoiceSchema,
  type CreateCompletionRequest,
  type CreateCompletionResponse,
  CreateCompletionResponseSchema,
  FinishReason,
  type ListModelsResponse,
  ListModelsResponseSchema,
  LogprobsSchema,
  ModelSchema,
  type StreamCompletionResponse,
  StreamCompletionResponseSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { ActivationsSchema } from "../../gen/acs/v1/lens_pb.js";
import { ApiError, toApiError } from "../errors/index.js";
import {
  captureLayers,
  captureLayerTokenLimit,
  checkCaptureCap,
  checkLensCounts,
  checkLensShapes,
  createSteeringBudget,
  lensVllmXargs,
  type SteeringBudget,
  type SteeringLease,
  tensorFromVllmLensJson,
} from "../lens/index.js";
import {
  buildVllmRequest,
  newCompletionId,
  newUpstreamRequestId,
  TextOffsets,
  toCompletionResponse,
  toStreamChunk,
  type VllmClient,
  type VllmCompletionRequest,
} from "../upstream/index.js";
import { type Admission, type AdmissionTicket, createAdmission, noAdmission } from "./admission.js";
import {
  checkContextLength,
  checkDeadlineFeasible,
  checkGeneratedTokensCap,
  checkMaxTokensGiven,
  checkMinTokens,
  checkStreamOnlyFields,
  requestShape,
  resolveMaxTokens,
} from "./checks.js";
import { countPromptTokens } from "./count-prompt-tokens.js";
import type { ModelRegistry, ServedModel } from "./model-registry.js";
import type { KeyInfo, Ledger } from "./ports.js";
import type { CallContext, CompletionsApi } from "./types.js";
import { UsageMeter } from "./usage-meter.js";
import { validateRequest } from "./validate-request.js";

/** Collaborators of the completions service. */
export interface CompletionsServiceDeps {
  readonly models: ModelRegistry<VllmClient>;
  /** The Budget ledger; undefined = keys and Budgets off (loopback only). */
  readonly ledger: Ledger | undefined;
  /** Longest wait for a non-streamed answer, ms (docs/API.md §5: 14 minutes). */
  readonly nonStreamDeadlineMs: number;
  /** How often a stream renews its Hold, ms. @default 60000 */
  readonly holdRenewIntervalMs?: number;
  /** Told of a ledger call that failed after the response was decided (renew, settle). @default process.emitWarning */
  readonly onLedgerError?: (err: unknown) => void;
  /** Bytes of decoded steering tensors in flight (429/413 past it). @default createSteeringBudget() */
  readonly steeringBudget?: SteeringBudget;
  /**
   * Per-key caps on requests in flight (429 `rate_limited` past them); they apply to keys only,
   * so not with keys off. @default createAdmission() (its default caps)
   */
  readonly admission?: Admission;
}

/** Header that reports a max_tokens lowered to what the Budget holds (docs/API.md §3). */
export const clampedHeader = "X-Acs-Max-Tokens-Clamped";

/** Everything decided before Inference is called. */
interface Prepared {
  readonly model: ServedModel<VllmClient>;
  readonly body: VllmCompletionRequest;
  /** Σ prompt tokens as the Hold counts them. */
  readonly promptTokens: number;
  readonly capture: boolean;
  /** The Hold on the key's Budget; undefined with keys off. */
  readonly hold: { readonly id: string; readonly tokens: number } | undefined;
  /** The request's decoded steering bytes on the steering budget; released when the request is done. */
  readonly steering: SteeringLease;
  /** The request's place among its key's requests in flight; released when the request is done. */
  readonly admission: AdmissionTicket;
}

/** Where `prepare` keeps the admission ticket, so that a later refusal releases it. */
interface AdmittedSlot {
  ticket: AdmissionTicket;
}

/** Ids shared by every chunk of one completion. */
interface CompletionIds {
  readonly id: string;
  readonly created: bigint;
  readonly model: string;
}

function completionIds(model: string): CompletionIds {
  return { id: newCompletionId(), created: BigInt(Math.floor(Date.now() / 1000)), model };
}

/**
 * The completions service: the one implementation behind REST and Connect. `prepare` runs the
 * contract's checks in its order (docs/API.md §3), each a named step, all before Inference sees the
 * request; then the request runs against Inference, and its Hold is settled exactly once, in one
 * place, by one rule ({@link UsageMeter}).
 */
export function createCompletionsService(deps: CompletionsServiceDeps): CompletionsApi {
  const { models, ledger } = deps;
  const renewEveryMs = deps.holdRenewIntervalMs ?? 60_000;
  const steeringBudget = deps.steeringBudget ?? createSteeringBudget();
  const admission = deps.admission ?? createAdmission();
  const onLedgerError =
    deps.onLedgerError ?? ((err: unknown) => process.emitWarning(`Budget ledger: ${String(err)}`));

  const authenticate = async (ctx: CallContext): Promise<KeyInfo | undefined> =>
    ledger === undefined ? undefined : await ledger.authenticate(ctx.authorization);

  /**
   * {@link prepareLeased} with a fresh steering lease and a slot for the admission ticket, both
   * released when a check refuses the request.
   */
  async function prepare(
    request: CreateCompletionRequest,
    ctx: CallContext,
    stream: boolean,
  ): Promise<Prepared> {
    const steering = steeringBudget.lease();
    const admitted: AdmittedSlot = { ticket: noAdmission };
    try {
      return await prepareLeased(request, ctx, stream, steering, admitted);
    } catch (err) {
      steering.release();
      admitted.ticket.release();
      throw err;
    }
  }

  /**
   * §9 per-key caps: the request's place among its key's requests in flight (requests, streams,
   * the model's share), or 429 `rate_limited`. Keys off: no caps (one trusted caller on loopback).
   */
  function admit(key: KeyInfo | undefined, model: ServedModel<VllmClient>, stream: boolean): AdmissionTicket {
    if (key === undefined) return noAdmission;
    return admission.admit(key.id, { stream, modelId: model.id, modelCapacity: model.upstreamCapacity });
  }

  async function prepareLeased(
    request: CreateCompletionRequest,
    ctx: CallContext,
    stream: boolean,
    steeringLease: SteeringLease,
    admitted: AdmittedSlot,
  ): Promise<Prepared> {
    // The order of checks of docs/API.md §3: key; ranges and cross-field rules; model; the key's
    // caps on requests in flight; the size caps; deadline_infeasible; prompt length; then the Hold.
    const key = await authenticate(ctx); //                                      §9 key (401)
    validateRequest(request); //                                                  §4 ranges, cross-field rules
    checkStreamOnlyFields(request, stream); //                                   §4 stream_options, prompt_logprobs
    const shape = requestShape(request);
    checkMaxTokensGiven(request, shape); //                                      §3 several prompts or n > 1
    checkLensCounts(request, shape); //                                          §6 one prompt, n = 1
    const model = models.resolve(request.model); //                             §2 model (404)
    if (key !== undefined) await ledger?.checkModel(key, model.id, model.aliases); // §9 allowed (403)
    admitted.ticket = admit(key, model, stream); //                               §9 per-key caps (429)
    const steering = checkLensShapes(request, model, steeringLease); //          §6 shapes, values (429/413: bytes)
    checkGeneratedTokensCap(request, shape); //                                  §3 size cap: 32,000
    let lengths = await checkCaptureCapUncounted(request, model, ctx.signal); // §6 size cap: capture
    checkDeadlineFeasible(request, stream); //                                   §3 deadline_infeasible
    lengths ??= await countPromptTokens(model.client, model.servedModelName, request, ctx.signal);
    let maxTokens = resolveMaxTokens(request, model.maxModelLen, lengths, stream); // §3 default
    checkContextLength(model.maxModelLen, lengths, maxTokens); //                §3 prompt length
    checkMinTokens(request, maxTokens);
    checkCaptureCap(request, model, { promptTokens: Math.max(...lengths), maxTokens }); // §6 exact
    const capture = request.outputResidualStream !== undefined;
    const promptTokens = lengths.reduce((a, b) => a + b, 0);

    let hold: Prepared["hold"];
    if (ledger !== undefined && key !== undefined) {
      const placed = await ledger.placeHold(key, {
        promptTokens,
        prompts: shape.prompts,
        n: shape.n,
        maxTokens,
        captureReplay: capture && stream,
      }); //                                                                    §9 Hold, §3 clamp
      hold = { id: placed.holdId, tokens: placed.heldTokens };
      if (placed.clamped) {
        maxTokens = placed.maxTokens;
        ctx.setResponseHeader(clampedHeader, String(maxTokens));
      }
    }
    try {
      const minTokens = request.minTokens === undefined ? undefined : Math.min(request.minTokens, maxTokens);
      const body = buildVllmRequest(minTokens === request.minTokens ? request : { ...request, minTokens }, {
        servedModelName: model.servedModelName,
        maxTokens,
        stream,
        vllmXargs: lensVllmXargs(request, model, steering),
      });
      ctx.onPrepared?.();
      return {
        model,
        body,
        promptTokens,
        capture,
        hold,
        steering: steeringLease,
        admission: admitted.ticket,
      };
    } catch (err) {
      await settle(hold, 0);
      throw err;
    }
  }

  /**
   * The capture cap is a size cap, checked before deadline_infeasible: when even a one-token prompt
   * would break it, the prompt is counted here (the message names its tokens) and the cap checked;
   * returns the counts then, else undefined (the exact check follows the count).
   */
  async function checkCaptureCapUncounted(
    request: CreateCompletionRequest,
    model: ServedModel<VllmClient>,
    signal: AbortSignal,
  ): Promise<number[] | undefined> {
    if (request.maxTokens === undefined) return undefined;
    if (captureLayers(request, model) * (1 + request.maxTokens) <= captureLayerTokenLimit(model.hiddenSize)) {
      return undefined;
    }
    const lengths = await countPromptTokens(model.client, model.servedModelName, request, signal);
    checkCaptureCap(request, model, { promptTokens: Math.max(...lengths), maxTokens: request.maxTokens });
    return lengths;
  }

  /** Settles a Hold to `used` tokens (a no-op without one). The one place a Hold ends. */
  async function settle(hold: Prepared["hold"], used: number): Promise<void> {
    if (hold === undefined || ledger === undefined) return;
    try {
      await ledger.settle(hold.id, used);
    } catch (err) {
      // The Hold stays open and expires (reclaimed); the caller's answer is already decided.
      onLedgerError(err);
    }
  }

  /**
   * Renews a stream's Hold once per renew interval, recording the tokens used so far (what a
   * reclaim after a crash charges), without holding up its chunks.
   */
  function holdRenewer(hold: Prepared["hold"], meter: UsageMeter): () => void {
    let last = Date.now();
    return () => {
      if (hold === undefined || ledger === undefined || Date.now() - last < renewEveryMs) return;
      last = Date.now();
      const used = meter.used;
      Promise.resolve()
        .then(() => ledger.renew(hold.id, used))
        .catch(onLedgerError);
    };
  }

  function residualStream(activations: unknown) {
    const rs = (activations as { residual_stream?: unknown } | null | undefined)?.residual_stream;
    if (rs === undefined || rs === null) {
      throw new ApiError("upstream_error", "Inference returned no activations for a capture request.");
    }
    return create(ActivationsSchema, { residualStream: tensorFromVllmLensJson(rs) });
  }

  /**
   * A streamed capture's activations: one more non-streamed prefill of prompt + generated tokens −
   * 1 with max_tokens 1 and the same steering, which gives exactly the positions a non-streamed
   * capture returns. Its prompt tokens are charged as prompt tokens (the Hold covered them).
   */
  async function captureReplay(
    prepared: Prepared,
    promptIds: readonly number[],
    generatedIds: readonly number[],
    ctx: CallContext,
    meter: UsageMeter,
  ) {
    const prompt = [...promptIds, ...generatedIds.slice(0, -1)];
    const body: VllmCompletionRequest = {
      ...prepared.body,
      prompt,
      max_tokens: 1,
      min_tokens: 0,
      n: 1,
      stream: false,
      echo: false,
      add_special_tokens: false,
      return_token_ids: false,
    };
    delete body.stream_options;
    delete body.logprobs;
    delete body.prompt_logprobs;
    const v = await prepared.model.client.complete(body, {
      signal: ctx.signal,
      deadlineMs: deps.nonStreamDeadlineMs,
      upstreamRequestId: newUpstreamRequestId(),
    });
    meter.addReplay(v.usage?.prompt_tokens ?? prompt.length);
    return residualStream(v.activations);
  }

  /**
   * Inference's stream as proto chunks of the caller's completion, metered: every chunk (usage
   * chunks included, token ids kept) in Inference's order, with `text_offset` that point into each
   * choice's text (one TextOffsets per stream). The upstream always streams token ids and usage,
   * so that what was generated is known at every moment.
   */
  async function* upstreamChunks(
    prepared: Prepared,
    ids: CompletionIds,
    signal: AbortSignal,
    meter: UsageMeter,
    body: VllmCompletionRequest,
  ): AsyncGenerator<StreamCompletionResponse> {
    const offsets = new TextOffsets();
    for await (const upstreamChunk of prepared.model.client.stream(
      { ...body, stream: true, return_token_ids: true },
      { signal, upstreamRequestId: newUpstreamRequestId() },
    )) {
      const chunk = toStreamChunk(upstreamChunk, ids, offsets);
      for (const choice of chunk.choices) meter.addGenerated(choice.tokenIds.length);
      if (chunk.choices.length === 0 && chunk.usage !== undefined) meter.report(chunk.usage.totalTokens);
      yield chunk;
    }
  }

  /**
   * A non-streamed completion from Inference's stream, collected: the tokens generated so far are
   * known at every moment, so a caller who goes away or the deadline is charged exactly what was
   * generated (vLLM reports no usage for an aborted non-streamed request). Choices are assembled per
   * index (text, logprobs rows, token ids, finish and stop reason of the last chunk).
   */
  async function collectStream(
    prepared: Prepared,
    request: CreateCompletionRequest,
    ctx: CallContext,
    meter: UsageMeter,
  ): Promise<CreateCompletionResponse> {
    const deadline = AbortSignal.timeout(deps.nonStreamDeadlineMs);
    const signal = AbortSignal.any([ctx.signal, deadline]);
    const ids = completionIds(request.model);
    const choices = new Map<number, CompletionChoice>();
    let usage: CreateCompletionResponse["usage"];
    const body: VllmCompletionRequest = {
      ...prepared.body,
      stream_options: { include_usage: true, continuous_usage_stats: false },
    };
    try {
      for await (const chunk of upstreamChunks(prepared, ids, signal, meter, body)) {
        if (chunk.choices.length === 0 && chunk.usage !== undefined) usage = chunk.usage;
        for (const part of chunk.choices) {
          const choice = choices.get(part.index) ?? create(CompletionChoiceSchema, { index: part.index });
          choice.text += part.text;
          if (part.logprobs !== undefined) {
            choice.logprobs ??= create(LogprobsSchema);
            choice.logprobs.content.push(...part.logprobs.content);
          }
          if (part.promptTokenIds.length > 0) choice.promptTokenIds = part.promptTokenIds;
          choice.tokenIds.push(...part.tokenIds);
          if (part.finishReason !== FinishReason.UNSPECIFIED) {
            choice.finishReason = part.finishReason;
            choice.stopReason = part.stopReason;
          }
          choices.set(part.index, choice);
        }
      }
    } catch (err) {
      if (deadline.aborted && !ctx.signal.aborted) {
        throw new ApiError(
          "deadline_exceeded",
          `Inference did not answer within ${deps.nonStreamDeadlineMs} ms.`,
          { cause: err },
        );
      }
      throw err;
    }
    const sorted = [...choices.values()].sort((a, b) => a.index - b.index);
    if (request.returnTokenIds !== true) {
      for (const c of sorted) {
        c.tokenIds = [];
        c.promptTokenIds = [];
      }
    }
    return create(CreateCompletionResponseSchema, { ...ids, choices: sorted, ...(usage ? { usage } : {}) });
  }

  /**
   * A non-streamed completion from Inference's non-streamed answer: the one place prompt_logprobs
   * and activations exist. Its tokens are unknown until Inference answers.
   */
  async function completeUnary(
    prepared: Prepared,
    request: CreateCompletionRequest,
    ctx: CallContext,
    meter: UsageMeter,
  ): Promise<CreateCompletionResponse> {
    meter.markUncounted();
    const v = await prepared.model.client.complete(
      { ...prepared.body, return_token_ids: true },
      { signal: ctx.signal, deadlineMs: deps.nonStreamDeadlineMs, upstreamRequestId: newUpstreamRequestId() },
    );
    const response = toCompletionResponse(v, request.model);
    for (const c of response.choices) meter.addGenerated(c.tokenIds.length);
    if (response.usage !== undefined) meter.report(response.usage.totalTokens);
    if (request.returnTokenIds !== true) {
      for (const c of response.choices) {
        c.tokenIds = [];
        c.promptTokenIds = [];
      }
    }
    if (prepared.capture) response.activations = residualStream(v.activations);
    return response;
  }

  async function createCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): Promise<CreateCompletionResponse> {
    const prepared = await prepare(request, ctx, false);
    const meter = new UsageMeter(prepared.promptTokens);
    let failure: unknown;
    try {
      // prompt_logprobs and activations exist only on Inference's non-streamed answer.
      return request.promptLogprobs === undefined && !prepared.capture
        ? await collectStream(prepared, request, ctx, meter)
        : await completeUnary(prepared, request, ctx, meter);
    } catch (err) {
      failure = err;
      throw toApiError(err);
    } finally {
      prepared.steering.release();
      prepared.admission.release();
      await settle(prepared.hold, meter.charge(failure, prepared.hold?.tokens ?? 0));
    }
  }

  async function* streamCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): AsyncGenerator<StreamCompletionResponse> {
    const prepared = await prepare(request, ctx, true);
    const meter = new UsageMeter(prepared.promptTokens);
    let failure: unknown;
    try {
      yield* streamChunks(prepared, request, ctx, meter);
    } catch (err) {
      failure = err;
      throw toApiError(err);
    } finally {
      prepared.steering.release();
      prepared.admission.release();
      // Also when the consumer stops early (a disconnect, a stalled caller): charged what was generated so far.
      await settle(prepared.hold, meter.charge(failure, prepared.hold?.tokens ?? 0));
    }
  }

  /**
   * The caller's chunks: text chunks as Inference streams them (token ids only when asked; usage
   * on every chunk only with include_usage and continuous_usage_stats both set, as vLLM does), the
   * usage chunk with include_usage, then a capture's activations in a chunk of their own.
   */
  async function* streamChunks(
    prepared: Prepared,
    request: CreateCompletionRequest,
    ctx: CallContext,
    meter: UsageMeter,
  ): AsyncGenerator<StreamCompletionResponse> {
    const includeUsage = request.streamOptions?.includeUsage === true;
    const continuousUsage = includeUsage && request.streamOptions?.continuousUsageStats === true;
    const returnTokenIds = request.returnTokenIds === true;
    const ids = completionIds(request.model);
    const renew = holdRenewer(prepared.hold, meter);
    let promptIds: number[] = [];
    const generatedIds: number[] = [];
    const body: VllmCompletionRequest = {
      ...prepared.body,
      stream_options: { include_usage: true, continuous_usage_stats: continuousUsage },
    };
    for await (const chunk of upstreamChunks(prepared, ids, ctx.signal, meter, body)) {
      if (chunk.choices.length === 0) {
        if (includeUsage && chunk.usage !== undefined) yield chunk;
        continue;
      }
      for (const choice of chunk.choices) {
        if (prepared.capture && choice.index === 0) {
          if (choice.promptTokenIds.length > 0) promptIds = [...choice.promptTokenIds];
          generatedIds.push(...choice.tokenIds);
        }
        if (!returnTokenIds) {
          choice.tokenIds = [];
          choice.promptTokenIds = [];
        }
      }
      if (!continuousUsage) chunk.usage = undefined;
      renew();
      yield chunk;
    }
    if (prepared.capture) {
      const activations = await captureReplay(prepared, promptIds, generatedIds, ctx, meter);
      yield create(StreamCompletionResponseSchema, { ...ids, choices: [], activations });
    }
  }

  async function listModels(ctx: CallContext): Promise<ListModelsResponse> {
    await authenticate(ctx);
    return create(ListModelsResponseSchema, {
      data: models.list().map((m) =>
        create(ModelSchema, {
          id: m.id,
          created: BigInt(m.created),
          ownedBy: m.ownedBy,
          aliases: [...m.aliases],
          maxModelLen: m.maxModelLen,
          hiddenSize: m.hiddenSize,
          numHiddenLayers: m.numLayers,
        }),
      ),
    });
  }

  return {
    authenticate: async (ctx) => {
      await authenticate(ctx);
    },
    createCompletion,
    streamCompletion,
    listModels,
  };
}
