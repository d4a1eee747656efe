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
  type Usage,
} from "../../gen/acs/v1/completions_pb.js";
import { ActivationsSchema } from "../../gen/acs/v1/lens_pb.js";
import { limits } from "../config/index.js";
import { ApiError, type ErrorCode, invalidRequest, toApiError } from "../errors/index.js";
import {
  captureLayers,
  captureLayerTokenLimit,
  checkCaptureCap,
  checkLensCounts,
  checkLensShapes,
  lensVllmXargs,
  tensorFromVllmLensJson,
} from "../lens/index.js";
import {
  buildVllmRequest,
  newCompletionId,
  newUpstreamRequestId,
  toCompletionResponse,
  toStreamChunk,
  type VllmClient,
  type VllmCompletionRequest,
} from "../upstream/index.js";
import type { ModelRegistry, ServedModel } from "./model-registry.js";
import type { KeyInfo, Ledger } from "./ports.js";
import type { CallContext, CompletionsApi } from "./types.js";
import { validateRequest } from "./validate-request.js";

/** Collaborators of the completions service. */
export interface CompletionsServiceDeps {
  readonly models: ModelRegistry<VllmClient>;
  /** The Budget ledger; undefined = keys and Budgets off (loopback only). */
  readonly ledger: Ledger | undefined;
  /** Longest wait for a non-streamed answer, ms (API.md §5: 14 minutes). */
  readonly nonStreamDeadlineMs: number;
  /** How often a stream renews its Hold, ms. @default 60000 */
  readonly holdRenewIntervalMs?: number;
}

/** Header that reports a max_tokens lowered to what the Budget holds (API.md §3). */
export const clampedHeader = "X-Acs-Max-Tokens-Clamped";

/** Everything decided before Inference is called. */
interface Prepared {
  readonly model: ServedModel<VllmClient>;
  readonly body: VllmCompletionRequest;
  /** Σ prompt tokens as the Hold counts them. */
  readonly promptTokens: number;
  readonly capture: boolean;
  readonly holdId: string | undefined;
  /** Tokens the Hold reserved (0 without a Hold). */
  readonly heldTokens: number;
}

/** Errors after which Inference did no work for the request: nothing is charged. */
const noWorkCodes = new Set<ErrorCode>([
  "upstream_unavailable",
  "invalid_request",
  "context_length_exceeded",
  "model_not_found",
]);

function promptLengthsWithoutTokenizer(request: CreateCompletionRequest): number[] | undefined {
  const p = request.prompt;
  if (p.case === "tokenIds") return [p.value.values.length];
  if (p.case === "tokenIdsList") return p.value.values.map((v) => v.values.length);
  return undefined;
}

function promptTexts(request: CreateCompletionRequest): string[] {
  const p = request.prompt;
  if (p.case === "text") return [p.value];
  if (p.case === "texts") return p.value.values;
  return [];
}

function promptCount(request: CreateCompletionRequest): number {
  const p = request.prompt;
  switch (p.case) {
    case "text":
      return 1;
    case "texts":
    case "tokenIdsList":
      return p.value.values.length;
    case "tokenIds":
      return 1;
    default:
      return 0;
  }
}

/**
 * The completions service: the one implementation behind REST and Connect. Order of checks
 * (API.md §3): key; field ranges and cross-field rules (protovalidate, stream-only fields,
 * max_tokens needed, lens needs one prompt and n = 1); model; lens shapes against the model; size
 * caps (32,000 generated tokens, the capture cap); deadline_infeasible; prompt length (tokens
 * counted by Inference's tokenizer) and the exact capture cap; then the Hold — all before
 * Inference sees the request. Every Hold is settled exactly once, whatever happens.
 */
export function createCompletionsService(deps: CompletionsServiceDeps): CompletionsApi {
  const { models, ledger } = deps;
  const renewEveryMs = deps.holdRenewIntervalMs ?? 60_000;

  async function countPromptTokens(
    model: ServedModel<VllmClient>,
    request: CreateCompletionRequest,
    signal: AbortSignal,
  ) {
    const direct = promptLengthsWithoutTokenizer(request);
    if (direct !== undefined) return direct;
    const addSpecialTokens = request.addSpecialTokens ?? true;
    const counts = await Promise.all(
      promptTexts(request).map((text) =>
        model.client.tokenize(model.servedModelName, text, addSpecialTokens, signal),
      ),
    );
    return counts.map((c) => c.count);
  }

  async function prepare(
    request: CreateCompletionRequest,
    ctx: CallContext,
    stream: boolean,
  ): Promise<Prepared> {
    const key: KeyInfo | undefined = ledger?.authenticate(ctx.authorization);
    validateRequest(request);
    if (!stream && request.streamOptions !== undefined) {
      throw invalidRequest("stream_options", "stream_options is only allowed when stream is true.");
    }
    if (stream && request.promptLogprobs !== undefined) {
      throw invalidRequest("prompt_logprobs", "prompt_logprobs is not available when stream is true.");
    }
    const prompts = promptCount(request);
    const n = request.n ?? 1;
    if (request.maxTokens === undefined && (prompts > 1 || n > 1)) {
      throw invalidRequest(
        "max_tokens",
        "max_tokens must be set when a request has more than one prompt or n above 1.",
      );
    }
    checkLensCounts(request, { prompts, n });
    const model = models.resolve(request.model);
    if (key !== undefined) ledger?.checkModel(key, model.id, model.aliases);
    checkLensShapes(request, model);

    // Size caps, then deadline_infeasible (API.md §3), for an explicit max_tokens.
    let lengths: number[] | undefined;
    if (request.maxTokens !== undefined) {
      const total = prompts * n * request.maxTokens;
      if (total > limits.maxGeneratedTokens) {
        throw invalidRequest(
          "max_tokens",
          `At most ${limits.maxGeneratedTokens} generated tokens in all: n = ${n} times max_tokens = ${request.maxTokens} for each of ${prompts} prompts is ${total}.`,
        );
      }
      // The capture cap with the least possible prompt (1 token); its message needs the real count.
      const layers = captureLayers(request, model);
      if (layers * (1 + request.maxTokens) > captureLayerTokenLimit(model.hiddenSize)) {
        lengths = await countPromptTokens(model, request, ctx.signal);
        checkCaptureCap(request, model, { promptTokens: Math.max(...lengths), maxTokens: request.maxTokens });
      }
      if (!stream && request.maxTokens > limits.maxNonStreamTokens) {
        throw new ApiError(
          "deadline_infeasible",
          `max_tokens = ${request.maxTokens} cannot be written within the API's 14-minute wait for a request without stream: send stream: true, or at most ${limits.maxNonStreamTokens} max_tokens.`,
          { param: "max_tokens" },
        );
      }
    }

    // Prompt length, with the tokens counted as the Hold counts them.
    lengths ??= await countPromptTokens(model, request, ctx.signal);
    const longest = Math.max(...lengths);
    const promptTokens = lengths.reduce((a, b) => a + b, 0);
    let maxTokens =
      request.maxTokens ??
      Math.max(
        1,
        Math.min(model.maxModelLen - longest, stream ? limits.maxGeneratedTokens : limits.maxNonStreamTokens),
      );
    lengths.forEach((len, i) => {
      if (len + maxTokens > model.maxModelLen) {
        const which = lengths.length > 1 ? ` (prompt ${i})` : "";
        throw new ApiError(
          "context_length_exceeded",
          `This model's maximum context length is ${model.maxModelLen} tokens. However, you requested ${len + maxTokens} tokens (${len} in your prompt${which}; ${maxTokens} for the completion). Please reduce your prompt; or completion length.`,
          { param: "prompt" },
        );
      }
    });
    if (request.minTokens !== undefined && request.minTokens > maxTokens) {
      throw invalidRequest(
        "min_tokens",
        `Invalid value for 'min_tokens': must be at most max_tokens (${maxTokens}).`,
      );
    }
    checkCaptureCap(request, model, { promptTokens: longest, maxTokens });
    const vllmXargs = lensVllmXargs(request, model);
    const capture = request.outputResidualStream !== undefined;

    let holdId: string | undefined;
    let heldTokens = 0;
    if (ledger !== undefined && key !== undefined) {
      const hold = ledger.placeHold(key, { promptTokens, prompts, n, maxTokens });
      holdId = hold.holdId;
      heldTokens = hold.heldTokens;
      if (hold.clamped) {
        maxTokens = hold.maxTokens;
        ctx.setResponseHeader(clampedHeader, String(maxTokens));
      }
    }
    try {
      const minTokens = request.minTokens === undefined ? undefined : Math.min(request.minTokens, maxTokens);
      const body = buildVllmRequest(minTokens === request.minTokens ? request : { ...request, minTokens }, {
        servedModelName: model.servedModelName,
        maxTokens,
        stream,
        vllmXargs,
      });
      ctx.onPrepared?.();
      return { model, body, promptTokens, capture, holdId, heldTokens };
    } catch (err) {
      settle(holdId, 0);
      throw err;
    }
  }

  function settle(holdId: string | undefined, used: number): void {
    if (holdId !== undefined) ledger?.settle(holdId, used);
  }

  /**
   * What a request that failed is charged. Nothing when Inference did no work for it. A stream
   * (and a non-streamed request served from a collected stream) knows what it generated: prompt +
   * the tokens streamed. A non-streamed request that Inference served without a stream
   * (prompt_logprobs, capture) and that was cut short by its caller or the deadline generated an
   * unknown number of tokens (vLLM reports none for an aborted request): it is charged its whole
   * Hold, the most it could have used, so that disconnecting is no way to free work.
   */
  function chargeOnError(err: unknown, prepared: Prepared, generated: number, counted: boolean): number {
    const code = err instanceof ApiError ? err.code : "internal_error";
    if (noWorkCodes.has(code)) return 0;
    if (!counted && (code === "canceled" || code === "deadline_exceeded")) {
      return Math.max(prepared.heldTokens, prepared.promptTokens);
    }
    return prepared.promptTokens + generated;
  }

  /** Activations for a streamed completion: one extra prefill of prompt + generated − last token. */
  async function captureAfterStream(
    prepared: Prepared,
    promptIds: readonly number[],
    generatedIds: readonly number[],
    ctx: CallContext,
  ) {
    const body: VllmCompletionRequest = {
      ...prepared.body,
      prompt: [...promptIds, ...generatedIds.slice(0, -1)],
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
    return residualStream(v.activations);
  }

  function residualStream(activations: unknown) {
    const rs = (activations as { residual_stream?: unknown } | null | undefined)?.residual_stream;
    if (rs === undefined || rs === null) {
      throw new ApiError("upstream_error", "Inference returned no activations for a capture request.");
    }
    return create(ActivationsSchema, { residualStream: tensorFromVllmLensJson(rs) });
  }

  /**
   * A non-streamed completion from Inference's stream, collected: the tokens generated so far are
   * known at every moment, so a caller who goes away or a deadline is charged exactly what was
   * generated (vLLM reports no usage for an aborted non-streamed request). Choices are assembled
   * per index (text, logprobs rows, token ids, finish and stop reason of the last chunk).
   */
  async function collectStream(
    prepared: Prepared,
    request: CreateCompletionRequest,
    ctx: CallContext,
    progress: { generated: number },
  ) {
    const deadline = AbortSignal.timeout(deps.nonStreamDeadlineMs);
    const signal = AbortSignal.any([ctx.signal, deadline]);
    const ids = {
      id: newCompletionId(),
      created: BigInt(Math.floor(Date.now() / 1000)),
      model: request.model,
    };
    const choices = new Map<number, CompletionChoice>();
    let usage: Usage | undefined;
    try {
      const body: VllmCompletionRequest = {
        ...prepared.body,
        stream: true,
        return_token_ids: true,
        stream_options: { include_usage: true, continuous_usage_stats: false },
      };
      for await (const upstreamChunk of prepared.model.client.stream(body, {
        signal,
        upstreamRequestId: newUpstreamRequestId(),
      })) {
        const chunk = toStreamChunk(upstreamChunk, ids);
        if (chunk.choices.length === 0 && chunk.usage !== undefined) usage = chunk.usage;
        for (const part of chunk.choices) {
          progress.generated += part.tokenIds.length;
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
          {
            cause: err,
          },
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

  async function createCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): Promise<CreateCompletionResponse> {
    const prepared = await prepare(request, ctx, false);
    // prompt_logprobs and activations exist only on Inference's non-streamed answer.
    const collected = request.promptLogprobs === undefined && !prepared.capture;
    const progress = { generated: 0 };
    let used = 0;
    try {
      if (collected) {
        const response = await collectStream(prepared, request, ctx, progress);
        used = response.usage?.totalTokens ?? prepared.promptTokens;
        return response;
      }
      const v = await prepared.model.client.complete(prepared.body, {
        signal: ctx.signal,
        deadlineMs: deps.nonStreamDeadlineMs,
        upstreamRequestId: newUpstreamRequestId(),
      });
      const response = toCompletionResponse(v, request.model);
      used = response.usage?.totalTokens ?? prepared.promptTokens;
      if (prepared.capture) response.activations = residualStream(v.activations);
      return response;
    } catch (err) {
      // collected: exactly what was generated; otherwise unknown (see chargeOnError)
      if (used === 0) used = chargeOnError(err, prepared, progress.generated, collected);
      throw toApiError(err);
    } finally {
      settle(prepared.holdId, used);
    }
  }

  async function* streamCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): AsyncGenerator<StreamCompletionResponse> {
    const prepared = await prepare(request, ctx, true);
    const includeUsage = request.streamOptions?.includeUsage === true;
    const continuousUsage = request.streamOptions?.continuousUsageStats === true;
    const returnTokenIds = request.returnTokenIds === true;
    const ids = {
      id: newCompletionId(),
      created: BigInt(Math.floor(Date.now() / 1000)),
      model: request.model,
    };
    let generated = 0;
    let usedFromUsage: number | undefined;
    let promptIds: number[] = [];
    const generatedIds: number[] = [];
    let lastRenew = Date.now();
    let settled = false;
    const finish = (used: number) => {
      if (!settled) {
        settled = true;
        settle(prepared.holdId, used);
      }
    };
    try {
      for await (const upstreamChunk of prepared.model.client.stream(
        { ...prepared.body, return_token_ids: true },
        { signal: ctx.signal, upstreamRequestId: newUpstreamRequestId() },
      )) {
        const chunk = toStreamChunk(upstreamChunk, ids);
        for (const choice of chunk.choices) {
          generated += choice.tokenIds.length;
          if (prepared.capture && choice.index === 0) {
            if (choice.promptTokenIds.length > 0) promptIds = [...choice.promptTokenIds];
            generatedIds.push(...choice.tokenIds);
          }
          if (!returnTokenIds) {
            choice.tokenIds = [];
            choice.promptTokenIds = [];
          }
        }
        if (chunk.choices.length === 0) {
          if (chunk.usage !== undefined) usedFromUsage = chunk.usage.totalTokens;
          if (includeUsage && chunk.usage !== undefined) yield chunk;
          continue;
        }
        if (!continuousUsage) chunk.usage = undefined;
        if (prepared.holdId !== undefined && Date.now() - lastRenew > renewEveryMs) {
          ledger?.renew(prepared.holdId);
          lastRenew = Date.now();
        }
        yield chunk;
      }
      if (prepared.capture) {
        const activations = await captureAfterStream(prepared, promptIds, generatedIds, ctx);
        yield create(StreamCompletionResponseSchema, { ...ids, choices: [], activations });
      }
      finish(usedFromUsage ?? prepared.promptTokens + generated);
    } catch (err) {
      finish(usedFromUsage ?? chargeOnError(err, prepared, generated, true));
      throw toApiError(err);
    } finally {
      // The consumer stopped early (disconnect): charge what was generated so far.
      finish(usedFromUsage ?? prepared.promptTokens + generated);
    }
  }

  async function listModels(ctx: CallContext): Promise<ListModelsResponse> {
    ledger?.authenticate(ctx.authorization);
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
    authenticate: (ctx) => {
      ledger?.authenticate(ctx.authorization);
    },
    createCompletion,
    streamCompletion,
    listModels,
  };
}
