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
  UsageSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { ActivationsSchema } from "../../gen/acs/v1/lens_pb.js";
import { limits } from "../config/index.js";
import { ApiError, inferenceDeadlineExceeded, toApiError } from "../errors/index.js";
import {
  createSteeringBudget,
  lensVllmXargs,
  type SteeringBudget,
  type SteeringLease,
  tensorFromVllmLensJson,
} from "../lens/index.js";
import {
  buildVllmRequest,
  newCompletionId,
  type StreamOptions,
  TextOffsets,
  toCompletionResponse,
  toStreamChunk,
  type VllmClient,
  type VllmCompletionChunk,
  type VllmCompletionRequest,
} from "../upstream/index.js";
import { type Admission, type AdmissionTicket, createAdmission, noAdmission } from "./admission.js";
import { CallEnd } from "./completions/call-end.js";
import { type CheckEnv, type Draft, newDraft, runChecks } from "./completions/check-order.js";
import { countPromptTokens, createSpecialTokenCounter } from "./count-prompt-tokens.js";
import { type FanOutPart, fanOutParts, mergeLimited } from "./lens-fan-out.js";
import type { ModelRegistry, ServedModel } from "./model-registry.js";
import type { KeyInfo, Ledger } from "./ports.js";
import { createTokenizeCalls } from "./tokenize-calls.js";
import type { CallContext, CompletionsApi } from "./types.js";
import { UsageMeter } from "./usage-meter.js";

/** Collaborators of the completions service. */
export interface CompletionsServiceDeps {
  readonly models: ModelRegistry<VllmClient>;
  /** The Budget ledger; undefined = keys and Budgets off (loopback only). */
  readonly ledger: Ledger | undefined;
  /** Longest wait for a non-streamed answer, ms (proto/API.md §5: 14 minutes). */
  readonly nonStreamDeadlineMs: number;
  /** How often a stream renews its Hold, ms. @default 60000 */
  readonly holdRenewIntervalMs?: number;
  /** Told of a ledger call that failed after the response was decided (renew, settle). @default process.emitWarning */
  readonly onLedgerError?: (err: unknown) => void;
  /** Bytes of decoded steering tensors in flight (429/413 past it). @default createSteeringBudget() */
  readonly steeringBudget?: SteeringBudget;
  /**
   * Inference requests one lens fan-out (proto/API.md §6) runs at once.
   * @default limits.lensFanOutConcurrency (8)
   */
  readonly lensFanOutConcurrency?: number;
  /**
   * Per-key caps on requests in flight (429 `rate_limited` past them); they apply to keys only,
   * so not with keys off. @default createAdmission() (its default caps)
   */
  readonly admission?: Admission;
}

/** The options of one upstream call of a prepared request: `signal`, its X-Request-Id and its tracer. */
function upstreamCallOptions(prepared: Prepared, signal: AbortSignal): StreamOptions {
  const upstreamRequestId = prepared.nextUpstreamId();
  const trace = prepared.ctx.record?.traceUpstream;
  return trace === undefined ? { signal, upstreamRequestId } : { signal, upstreamRequestId, trace };
}

/** Records the moment Inference's first generated token arrived (once). */
function markFirstToken(ctx: CallContext): void {
  if (ctx.record !== undefined && ctx.record.firstTokenAt === undefined) {
    ctx.record.firstTokenAt = performance.now();
  }
}

/** The call has passed its checks and runs against Inference ({@link CallRecord.running}). */
function startRunning(ctx: CallContext): void {
  if (ctx.record !== undefined) ctx.record.running = true;
}

/** The call's tokens are recorded: whoever waits for them ({@link CallRecord.onEnd}) goes on. */
function endRunning(ctx: CallContext): void {
  const record = ctx.record;
  if (record === undefined || record.running !== true) return;
  record.running = false;
  const onEnd = record.onEnd;
  delete record.onEnd;
  onEnd?.();
}

/** Records the code of the error a call ends with; returns the error. */
function recordError(ctx: CallContext, err: ApiError): ApiError {
  if (ctx.record !== undefined) ctx.record.errorCode = err.code;
  return err;
}

/** `step`'s result; a refusal's code recorded on the way out. */
async function recorded<T>(ctx: CallContext, step: Promise<T>): Promise<T> {
  try {
    return await step;
  } catch (err) {
    recordError(ctx, toApiError(err));
    throw err;
  }
}

/** Records the prompt and completion tokens of a call that reached Inference. */
function recordTokens(ctx: CallContext, meter: UsageMeter): void {
  if (ctx.record === undefined) return;
  ctx.record.promptTokens = meter.promptTokens;
  ctx.record.completionTokens = meter.generated;
}

/** Everything decided before Inference is called. */
interface Prepared {
  readonly model: ServedModel<VllmClient>;
  readonly body: VllmCompletionRequest;
  /**
   * Prompt tokens as the Hold counts them, per upstream request: one entry (Σ over the prompts),
   * or one per part of a fan-out (its prompt's tokens).
   */
  readonly promptTokens: readonly number[];
  /** The upstream requests of a lens fan-out (proto/API.md §6); undefined: `body` as one request. */
  readonly parts: readonly FanOutPart[] | undefined;
  /** Each prompt's bound of its tokens when they were not counted exactly (the Hold holds the bound; never with `parts`). */
  readonly promptBounds: readonly number[] | undefined;
  /** Each prompt's tokens as the Hold counts them: exact, or `promptBounds`. */
  readonly promptLengths: readonly number[];
  /** The call the request was prepared for (its upstream ids, trace and timings are recorded on it). */
  readonly ctx: CallContext;
  readonly capture: boolean;
  /** The Hold on the key's Budget; undefined with keys off. */
  readonly hold: { readonly id: string; readonly tokens: number } | undefined;
  /** The request's decoded steering bytes on the steering budget; released when the request is done. */
  readonly steering: SteeringLease;
  /**
   * The X-Request-Id of the request's next upstream call: the request id, then `<id>-2`, `<id>-3`…
   * (a streamed capture's replay), so that Inference's logs name the gateway's request.
   */
  readonly nextUpstreamId: () => string;
  /** The request's place among its key's requests in flight; released when the request is done. */
  readonly admission: AdmissionTicket;
}

/** The ids of one request's upstream calls (see {@link Prepared.nextUpstreamId}). */
function upstreamIds(requestId: string): () => string {
  let n = 0;
  return () => (++n === 1 ? requestId : `${requestId}-${n}`);
}

/** Ids shared by every chunk of one completion. */
interface CompletionIds {
  readonly id: string;
  readonly created: bigint;
  readonly model: string;
}

/** Σ of a list of token counts. */
function sum(counts: readonly number[]): number {
  let total = 0;
  for (const c of counts) total += c;
  return total;
}

/** A signal that never aborts (a count made after the caller went away). */
const neverAborted = new AbortController().signal;

/** The meter of a prepared request: its prompt tokens exact, or bounds until Inference tells them. */
function newMeter(prepared: Prepared, request: CreateCompletionRequest): UsageMeter {
  return prepared.promptBounds === undefined
    ? new UsageMeter(prepared.promptTokens)
    : new UsageMeter(prepared.promptTokens, { perPrompt: prepared.promptBounds, n: request.n ?? 1 });
}

/** A Usage of the gateway's own counts ({@link UsageMeter.countedUsage}). */
function usageOf(counts: ReturnType<UsageMeter["countedUsage"]>): Usage | undefined {
  return counts === undefined ? undefined : create(UsageSchema, counts);
}

/**
 * Each choice's usage so far as the gateway counts it, for continuous_usage_stats when Inference
 * sends none: as vLLM counts it, the choice's prompt tokens (its prompt token ids, else its
 * prompt's exact count) and the tokens it generated so far (its token ids).
 */
class ChoiceCounts {
  readonly #choices = new Map<number, { prompt: number | undefined; generated: number }>();
  readonly #prepared: Prepared;
  readonly #meter: UsageMeter;
  readonly #n: number;

  constructor(prepared: Prepared, meter: UsageMeter, n: number) {
    this.#prepared = prepared;
    this.#meter = meter;
    this.#n = n;
  }

  /** Counts `choice` (a chunk's piece, token ids still on it); its usage so far, undefined while its prompt's tokens are a bound. */
  add(choice: CompletionChoice): Usage | undefined {
    let c = this.#choices.get(choice.index);
    if (c === undefined) {
      c = { prompt: undefined, generated: 0 };
      this.#choices.set(choice.index, c);
    }
    if (choice.promptTokenIds.length > 0) c.prompt = choice.promptTokenIds.length;
    c.generated += choice.tokenIds.length;
    const p = Math.floor(choice.index / this.#n);
    const prompt =
      c.prompt ??
      (this.#prepared.promptBounds === undefined
        ? this.#prepared.promptLengths[p]
        : this.#meter.exactPromptTokens(p));
    if (prompt === undefined) return undefined;
    return create(UsageSchema, {
      promptTokens: prompt,
      completionTokens: c.generated,
      totalTokens: prompt + c.generated,
    });
  }
}

function completionIds(model: string): CompletionIds {
  return { id: newCompletionId(), created: BigInt(Math.floor(Date.now() / 1000)), model };
}

/**
 * The streamed upstream request of `body`: streamed, with token ids and the usage chunk always
 * (what was generated is known at every moment), usage on every chunk only with `continuousUsage`.
 */
function upstreamStreamBody(body: VllmCompletionRequest, continuousUsage: boolean): VllmCompletionRequest {
  return {
    ...body,
    stream: true,
    return_token_ids: true,
    stream_options: { include_usage: true, continuous_usage_stats: continuousUsage },
  };
}

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

/** The sum of several upstream requests' usage (a lens fan-out's usage, proto/API.md §6). */
function sumUsage(usages: readonly Usage[]): Usage {
  const sum = create(UsageSchema);
  for (const u of usages) {
    sum.promptTokens += u.promptTokens;
    sum.completionTokens += u.completionTokens;
    sum.totalTokens += u.totalTokens;
  }
  return sum;
}

/**
 * The completions service: the one implementation behind REST and Connect. `prepare` runs the
 * contract's checks in its order (proto/API.md §3), each a named step, all before Inference sees the
 * request; then the request runs against Inference, and its Hold is settled exactly once, in one
 * place, by one rule ({@link UsageMeter}).
 */
export function createCompletionsService(deps: CompletionsServiceDeps): CompletionsApi {
  const { models, ledger } = deps;
  const renewEveryMs = deps.holdRenewIntervalMs ?? 60_000;
  const fanOutConcurrency = deps.lensFanOutConcurrency ?? limits.lensFanOutConcurrency;
  const steeringBudget = deps.steeringBudget ?? createSteeringBudget();
  const admission = deps.admission ?? createAdmission();
  const onLedgerError =
    deps.onLedgerError ?? ((err: unknown) => process.emitWarning(`Budget ledger: ${String(err)}`));
  /** Models whose prompts came back longer than their bound: counted exactly from then on. */
  const boundBroken = new WeakSet<ServedModel<VllmClient>>();

  const authenticate = async (ctx: CallContext): Promise<KeyInfo | undefined> =>
    ledger === undefined ? undefined : await ledger.authenticate(ctx.authorization);

  const checkEnv: CheckEnv = {
    models,
    ledger,
    admission,
    fanOutConcurrency,
    specialTokens: createSpecialTokenCounter(),
    boundBroken,
  };

  /**
   * Runs the check order (src/service/completions/check-order.ts) on a draft with a fresh
   * steering lease, and turns what it decided into the call's Prepared; a refusal releases the
   * lease and the admission ticket (and settles a Hold already placed to 0).
   */
  async function prepare(
    request: CreateCompletionRequest,
    ctx: CallContext,
    stream: boolean,
  ): Promise<Prepared> {
    const draft = newDraft(request, ctx, stream, steeringBudget.lease(), noAdmission);
    try {
      await runChecks(draft, checkEnv);
      return preparedOf(draft);
    } catch (err) {
      // Refused: nothing reached Inference, a Hold already placed is settled to 0.
      await new CallEnd({ steering: draft.steeringLease, admission: draft.ticket }, () =>
        settle(draft.hold, 0),
      ).end(err);
      throw err;
    }
  }

  /**
   * A call that passed its checks, running: its Prepared, its usage meter, and its one end
   * ({@link CallEnd}: lease and ticket released, the Hold settled to the meter's charge).
   */
  async function begin(request: CreateCompletionRequest, ctx: CallContext, stream: boolean) {
    const prepared = await recorded(ctx, prepare(request, ctx, stream));
    if (stream) ctx.record?.streamStarted?.();
    startRunning(ctx);
    const meter = newMeter(prepared, request);
    const call = new CallEnd(prepared, (failure) => chargeAndSettle(prepared, request, meter, failure, ctx));
    return { prepared, meter, call };
  }

  /** A fan-out's parts run at once: the concurrency, at most what the key's share admitted. */
  function partsAtOnce(prepared: Prepared): number {
    return Math.max(1, Math.min(fanOutConcurrency, prepared.admission.upstreamRequests));
  }

  /** The call's Prepared from a draft every check passed: the vLLM body (and a fan-out's parts). */
  function preparedOf(draft: Draft): Prepared {
    const { request, ctx, shape, hold, maxTokens } = draft;
    const model = draft.model;
    const lengths = draft.lengths;
    if (model === undefined || lengths === undefined) throw new Error("unreachable: the checks did not run");
    const minTokens = request.minTokens === undefined ? undefined : Math.min(request.minTokens, maxTokens);
    const body = buildVllmRequest(minTokens === request.minTokens ? request : { ...request, minTokens }, {
      servedModelName: model.servedModelName,
      maxTokens,
      stream: draft.stream,
      vllmXargs: lensVllmXargs(request, model, draft.steering),
    });
    const parts = draft.fanOut ? fanOutParts(body, shape) : undefined;
    ctx.onPrepared?.();
    return {
      model,
      body,
      promptTokens: parts === undefined ? [sum(lengths)] : parts.map((part) => lengths[part.prompt] ?? 0),
      promptBounds: draft.bounds,
      promptLengths: lengths,
      parts,
      capture: request.outputResidualStream !== undefined,
      hold,
      steering: draft.steeringLease,
      nextUpstreamId: upstreamIds(ctx.requestId),
      ctx,
      admission: draft.ticket,
    };
  }

  /**
   * The tokens to charge a request that ended with `failure` ({@link UsageMeter.charge}). When the
   * charge would use prompt tokens that are still a bound (a stream cut short before Inference
   * told its prompt), they are counted exactly first (`/tokenize`, without the caller's signal,
   * which may have aborted); should that fail, the bound stays (the charge never exceeds the Hold).
   */
  async function chargeOf(
    prepared: Prepared,
    request: CreateCompletionRequest,
    meter: UsageMeter,
    failure: unknown,
  ): Promise<number> {
    if (meter.boundBroken && !boundBroken.has(prepared.model)) {
      boundBroken.add(prepared.model);
      process.emitWarning(
        `model ${prepared.model.id}: a prompt had more tokens than its UTF-8 bytes + special tokens; byte_level_tokenizer is wrong for it, prompts are counted by /tokenize from now on`,
      );
    }
    if (prepared.hold !== undefined && meter.chargeNeedsPromptCount(failure)) {
      try {
        const { client, servedModelName } = prepared.model;
        meter.setPromptTokens(await countPromptTokens(client, servedModelName, request, neverAborted));
      } catch {
        // Inference is unreachable: the bound stays.
      }
    }
    return meter.charge(failure, prepared.hold?.tokens ?? 0);
  }

  /**
   * The usage of meter part `part` as the gateway counted it ({@link UsageMeter.countedUsage}: what
   * it is charged), for a response whose Inference request reported none. Prompt tokens that are
   * still a bound are counted exactly first (`/tokenize`); undefined when that fails (no number is
   * made up).
   */
  async function countedUsage(
    prepared: Prepared,
    request: CreateCompletionRequest,
    meter: UsageMeter,
    part: number,
    signal: AbortSignal,
  ): Promise<Usage | undefined> {
    if (!meter.promptCounted) {
      try {
        const { client, servedModelName } = prepared.model;
        meter.setPromptTokens(await countPromptTokens(client, servedModelName, request, signal));
      } catch {
        return undefined;
      }
    }
    return usageOf(meter.countedUsage(part));
  }

  /**
   * The end of every completion that reached Inference: counts its charge ({@link chargeOf}),
   * records its tokens for the access line and the metrics, ends {@link CallRecord.running} (also
   * when counting throws), then settles its Hold.
   */
  async function chargeAndSettle(
    prepared: Prepared,
    request: CreateCompletionRequest,
    meter: UsageMeter,
    failure: unknown,
    ctx: CallContext,
  ): Promise<void> {
    let charge: number;
    try {
      charge = await chargeOf(prepared, request, meter, failure);
      recordTokens(ctx, meter);
    } finally {
      endRunning(ctx);
    }
    await settle(prepared.hold, charge);
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
   * `true` when the request's Hold still covers what it may deliver (always without a Hold, and
   * with one in the usual case: no promise is made); else a promise that resolves once the ledger
   * confirmed it, or rejects with ApiError 429 `insufficient_quota` when the Budget no longer holds
   * it ({@link Ledger.standing}). Asked before each chunk of a stream and before a non-streamed
   * answer: nothing is delivered that the Budget does not cover.
   */
  function holdStands(hold: Prepared["hold"]): true | Promise<void> {
    if (hold === undefined || ledger === undefined) return true;
    const standing = ledger.standing(hold.id);
    if (standing === true) return true;
    return standing.then((stands) => {
      if (!stands) {
        throw new ApiError(
          "insufficient_quota",
          "You exceeded your current quota: the key's Budget no longer holds the tokens of this request " +
            "(this gateway replica could not renew its Hold on them in time, and they were given back " +
            "to the Budget for other requests).",
        );
      }
    });
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
   * 1 with max_tokens 1 and the same steering (`body`: the upstream request that streamed them),
   * which gives exactly the positions a non-streamed capture returns. Its prompt tokens are charged
   * as prompt tokens of meter part `part` (the Hold covered them).
   */
  async function captureReplay(
    prepared: Prepared,
    upstreamBody: VllmCompletionRequest,
    promptIds: readonly number[],
    generatedIds: readonly number[],
    signal: AbortSignal,
    meter: UsageMeter,
    part: number,
  ) {
    const prompt = [...promptIds, ...generatedIds.slice(0, -1)];
    const body: VllmCompletionRequest = {
      ...upstreamBody,
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
      ...upstreamCallOptions(prepared, signal),
      deadlineMs: deps.nonStreamDeadlineMs,
    });
    meter.addReplay(v.usage?.prompt_tokens ?? prompt.length, part);
    return residualStream(v.activations);
  }

  /**
   * Inference's stream of `body` (a request built by {@link upstreamStreamBody}), metered on part
   * `part` from its first chunk. Each chunk goes through {@link meteredChunk} in the caller's loop
   * (no generator layer of its own between the client's stream and the caller: this runs per chunk).
   */
  function upstreamStream(
    prepared: Prepared,
    body: VllmCompletionRequest,
    signal: AbortSignal,
    meter: UsageMeter,
    part: number,
    onRestart?: () => void,
  ): AsyncIterable<VllmCompletionChunk> {
    meter.markStarted(part);
    const options = upstreamCallOptions(prepared, signal);
    if (onRestart !== undefined) options.onRestart = onRestart;
    return prepared.model.client.stream(body, options);
  }

  /**
   * One chunk of Inference's stream as a proto chunk of the caller's completion, metered on part
   * `part`: usage chunks included, token ids kept, with `text_offset` that point into each choice's
   * text (`offsets`: one TextOffsets per stream). The upstream always streams token ids and usage,
   * so that what was generated is known at every moment.
   */
  function meteredChunk(
    prepared: Prepared,
    upstreamChunk: VllmCompletionChunk,
    ids: CompletionIds,
    offsets: TextOffsets,
    meter: UsageMeter,
    part: number,
  ): StreamCompletionResponse {
    const chunk = toStreamChunk(upstreamChunk, ids, offsets);
    for (const choice of chunk.choices) {
      meter.addGenerated(choice.tokenIds.length, part);
      if (choice.promptTokenIds.length > 0)
        meter.notePromptTokens(choice.index, choice.promptTokenIds.length);
    }
    if (meter.generated > 0) markFirstToken(prepared.ctx);
    if (chunk.choices.length === 0 && chunk.usage !== undefined) meter.report(chunk.usage.totalTokens, part);
    return chunk;
  }

  /**
   * A non-streamed completion of `body` from Inference's stream, collected: the tokens generated so
   * far are known at every moment, so a caller who goes away or the deadline is charged exactly
   * what was generated (vLLM reports no usage for an aborted non-streamed request). Choices are
   * assembled per index (text, logprobs rows, token ids, finish and stop reason of the last chunk).
   */
  async function collectStream(
    prepared: Prepared,
    upstreamBody: VllmCompletionRequest,
    request: CreateCompletionRequest,
    callerSignal: AbortSignal,
    meter: UsageMeter,
    part: number,
  ): Promise<CreateCompletionResponse> {
    // The caller's signal and the deadline as one: a controller, a listener and a timer, all
    // dropped when the call ends (cheaper than AbortSignal.any over AbortSignal.timeout).
    const linked = new AbortController();
    const signal = linked.signal;
    let timedOut = false;
    const onCaller = () => linked.abort(callerSignal.reason);
    if (callerSignal.aborted) onCaller();
    else callerSignal.addEventListener("abort", onCaller, { once: true });
    const timer = setTimeout(() => {
      timedOut = true;
      linked.abort(inferenceDeadlineExceeded(deps.nonStreamDeadlineMs));
    }, deps.nonStreamDeadlineMs);
    const ids = completionIds(request.model);
    // The choices in the order they first came; each is the first piece of its index (a fresh
    // message of this stream's only), the later pieces appended to it.
    const choices: CompletionChoice[] = [];
    let usage: CreateCompletionResponse["usage"];
    const body = upstreamStreamBody(upstreamBody, false);
    let offsets = new TextOffsets();
    // The caller has seen nothing yet: a failover after chunks starts the answer over.
    const restart = (): void => {
      choices.length = 0;
      usage = undefined;
      offsets = new TextOffsets();
      meter.restart(part);
    };
    try {
      for await (const upstreamChunk of upstreamStream(prepared, body, signal, meter, part, restart)) {
        const chunk = meteredChunk(prepared, upstreamChunk, ids, offsets, meter, part);
        if (chunk.choices.length === 0 && chunk.usage !== undefined) usage = chunk.usage;
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
    } catch (err) {
      if (timedOut && !callerSignal.aborted) {
        throw inferenceDeadlineExceeded(deps.nonStreamDeadlineMs, err);
      }
      throw err;
    } finally {
      clearTimeout(timer);
      callerSignal.removeEventListener("abort", onCaller);
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
    usage ??= await countedUsage(prepared, request, meter, part, callerSignal);
    if (usage !== undefined) response.usage = usage;
    return response;
  }

  /**
   * A non-streamed completion of `body` from Inference's non-streamed answer: the one place
   * prompt_logprobs and activations exist (a capture's are set at the top level). Its tokens are
   * unknown until Inference answers.
   */
  async function completeUnary(
    prepared: Prepared,
    body: VllmCompletionRequest,
    request: CreateCompletionRequest,
    signal: AbortSignal,
    meter: UsageMeter,
    part: number,
  ): Promise<CreateCompletionResponse> {
    meter.markUncounted(part);
    const v = await prepared.model.client.complete(
      { ...body, return_token_ids: true },
      { ...upstreamCallOptions(prepared, signal), deadlineMs: deps.nonStreamDeadlineMs },
    );
    const response = toCompletionResponse(v, request.model);
    for (const c of response.choices) {
      meter.addGenerated(c.tokenIds.length, part);
      // Bounded prompts become exact here, as from a stream's first chunk: the access log and the
      // prompt-token metrics count Inference's tokens, and a prompt longer than its bound is seen.
      if (c.promptTokenIds.length > 0) meter.notePromptTokens(c.index, c.promptTokenIds.length);
    }
    // No first-token time: the whole answer came at once (the time to first token would be the
    // request's, and the time per output token ~0).
    if (response.usage !== undefined) meter.report(response.usage.totalTokens, part);
    // Inference reported no usage: the gateway's own count (its token ids), as charged.
    else {
      const usage = await countedUsage(prepared, request, meter, part, signal);
      if (usage !== undefined) response.usage = usage;
    }
    if (request.returnTokenIds !== true) {
      for (const c of response.choices) {
        c.tokenIds = [];
        c.promptTokenIds = [];
      }
    }
    if (prepared.capture) response.activations = residualStream(v.activations);
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
  function completeOne(
    prepared: Prepared,
    body: VllmCompletionRequest,
    request: CreateCompletionRequest,
    signal: AbortSignal,
    meter: UsageMeter,
    part: number,
  ): Promise<CreateCompletionResponse> {
    return request.promptLogprobs === undefined && !prepared.capture
      ? collectStream(prepared, body, request, signal, meter, part)
      : completeUnary(prepared, body, request, signal, meter, part);
  }

  /**
   * A lens fan-out's whole completion (proto/API.md §6): every part completed (at most
   * `fanOutConcurrency` at once) under one deadline for the whole request, each part's one choice
   * renumbered to its index (with its activations on the choice), usage summed over the parts. The
   * first failure aborts the other parts and is thrown once they have ended.
   */
  async function completeFanOut(
    prepared: Prepared,
    parts: readonly FanOutPart[],
    request: CreateCompletionRequest,
    ctx: CallContext,
    meter: UsageMeter,
  ): Promise<CreateCompletionResponse> {
    const deadline = new AbortController();
    const timer = setTimeout(
      () => deadline.abort(inferenceDeadlineExceeded(deps.nonStreamDeadlineMs)),
      deps.nonStreamDeadlineMs,
    );
    const signal = AbortSignal.any([ctx.signal, deadline.signal]);
    const sources = parts.map(
      (part, i) =>
        async function* (partSignal: AbortSignal) {
          yield { part, response: await completeOne(prepared, part.body, request, partSignal, meter, i) };
        },
    );
    const choices: CompletionChoice[] = [];
    const usages: Usage[] = [];
    try {
      for await (const { part, response } of mergeLimited(sources, partsAtOnce(prepared), signal)) {
        const choice = response.choices[0];
        if (choice === undefined || response.choices.length !== 1) {
          throw new ApiError(
            "upstream_error",
            `Inference returned ${response.choices.length} choices for a request with n = 1.`,
          );
        }
        choice.index = part.index;
        if (response.activations !== undefined) choice.activations = response.activations;
        choices.push(choice);
        if (response.usage !== undefined) usages.push(response.usage);
      }
    } finally {
      clearTimeout(timer);
    }
    choices.sort((a, b) => a.index - b.index);
    const usage = usages.length === parts.length ? sumUsage(usages) : undefined;
    return create(CreateCompletionResponseSchema, {
      ...completionIds(request.model),
      choices,
      ...(usage ? { usage } : {}),
    });
  }

  async function createCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): Promise<CreateCompletionResponse> {
    const { prepared, meter, call } = await begin(request, ctx, false);
    let failure: unknown;
    try {
      const response =
        prepared.parts === undefined
          ? await completeOne(prepared, prepared.body, request, ctx.signal, meter, 0)
          : await completeFanOut(prepared, prepared.parts, request, ctx, meter);
      const stands = holdStands(prepared.hold);
      if (stands !== true) await stands;
      return response;
    } catch (err) {
      failure = err;
      throw recordError(ctx, toApiError(err));
    } finally {
      await call.end(failure);
    }
  }

  async function* streamCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): AsyncGenerator<StreamCompletionResponse> {
    const { prepared, meter, call } = await begin(request, ctx, true);
    let failure: unknown;
    try {
      if (prepared.parts !== undefined) {
        yield* streamFanOut(prepared, prepared.parts, request, ctx, meter);
      } else {
        // One request to Inference: its chunks are converted in this generator's loop, with no
        // generator between it and the upstream stream (each layer would keep a pending request,
        // its promise and an async frame from one chunk to the next, at every chunk).
        const single = singleStream(prepared, request, ctx, meter);
        const upstream = single.upstream;
        // `for await (const c of upstream)`, written out so that no chunk is held while the next
        // is awaited (`for await` keeps the last result and its variable until the next comes): a
        // chunk kept for the second or more between two outlives V8's young generation, and
        // thousands of streams then pile up garbage in the old one that only a full collection frees.
        let open = true; // left early (consumer gone, a throw here): close it, as `for await` does
        try {
          for (;;) {
            let step: IteratorResult<VllmCompletionChunk> | undefined;
            try {
              step = await upstream.next();
            } catch (err) {
              open = false; // a failing iterator is not closed
              throw err;
            }
            if (step.done === true) {
              open = false;
              break;
            }
            let chunk = single.callerChunk(step.value);
            step = undefined;
            if (chunk === undefined) continue;
            const stands = holdStands(prepared.hold);
            if (stands !== true) await stands;
            yield chunk;
            chunk = undefined;
          }
        } catch (err) {
          if (open) {
            open = false;
            // As `for await`: the loop's own error wins over one of the close.
            await upstream.return?.().catch(() => undefined);
          }
          throw err;
        } finally {
          if (open) await upstream.return?.();
        }
        const usage = await single.countedUsageChunk();
        if (usage !== undefined) {
          const stands = holdStands(prepared.hold);
          if (stands !== true) await stands;
          yield usage;
        }
        const activations = await single.activations();
        if (activations !== undefined) {
          const stands = holdStands(prepared.hold);
          if (stands !== true) await stands;
          yield activations;
        }
      }
    } catch (err) {
      failure = err;
      throw recordError(ctx, toApiError(err));
    } finally {
      // Also when the consumer stops early (a disconnect): charged what was generated so far.
      await call.end(failure);
    }
  }

  /**
   * The caller's chunks of one request to Inference (no fan-out), for {@link streamCompletion}'s
   * loop: Inference's stream (`upstream`); `callerChunk`, each of its chunks as the caller's —
   * text chunks as Inference streams them (token ids only when asked; usage on every chunk only
   * with include_usage and continuous_usage_stats both set, as vLLM does), the usage chunk with
   * include_usage, undefined for a chunk the caller does not get; and after the last,
   * `activations`: a capture's activations in a chunk of their own (undefined without a capture).
   */
  function singleStream(
    prepared: Prepared,
    request: CreateCompletionRequest,
    ctx: CallContext,
    meter: UsageMeter,
  ) {
    const includeUsage = request.streamOptions?.includeUsage === true;
    const continuousUsage = includeUsage && request.streamOptions?.continuousUsageStats === true;
    const returnTokenIds = request.returnTokenIds === true;
    const ids = completionIds(request.model);
    const renew = holdRenewer(prepared.hold, meter);
    let promptIds: number[] = [];
    const generatedIds: number[] = [];
    /** The last usage Inference sent (continuous_usage_stats: the usage so far). */
    let usageSoFar: Usage | undefined;
    /** Whether Inference sent its usage chunk (else, with include_usage, the gateway's count is sent). */
    let usageChunkSent = false;
    /** With continuous_usage_stats and no usage from Inference: each choice's counts, and the last chunk's usage. */
    const counts = continuousUsage ? new ChoiceCounts(prepared, meter, request.n ?? 1) : undefined;
    let countedSoFar: Usage | undefined;
    // Only a capture needs the upstream request again (its replay); otherwise it is not kept here.
    const replayBody = prepared.capture ? upstreamStreamBody(prepared.body, continuousUsage) : undefined;
    const offsets = new TextOffsets();
    const upstream = upstreamStream(
      prepared,
      replayBody ?? upstreamStreamBody(prepared.body, continuousUsage),
      ctx.signal,
      meter,
      0,
    )[Symbol.asyncIterator]();
    return {
      upstream,
      callerChunk(upstreamChunk: VllmCompletionChunk): StreamCompletionResponse | undefined {
        const chunk = meteredChunk(prepared, upstreamChunk, ids, offsets, meter, 0);
        if (chunk.usage !== undefined) usageSoFar = chunk.usage;
        if (chunk.choices.length === 0) {
          if (chunk.usage === undefined) return undefined;
          usageChunkSent = true;
          return includeUsage ? chunk : undefined;
        }
        for (const choice of chunk.choices) {
          if (counts !== undefined && usageSoFar === undefined) countedSoFar = counts.add(choice);
          if (prepared.capture && choice.index === 0) {
            if (choice.promptTokenIds.length > 0) promptIds = [...choice.promptTokenIds];
            generatedIds.push(...choice.tokenIds);
          }
          if (!returnTokenIds) {
            if (choice.tokenIds.length > 0) choice.tokenIds = [];
            if (choice.promptTokenIds.length > 0) choice.promptTokenIds = [];
          }
        }
        // Every chunk carries the usage so far (proto/API.md §5), also one Inference sent without;
        // the gateway's count of its choice when Inference sends none.
        chunk.usage = continuousUsage ? (usageSoFar ?? countedSoFar) : undefined;
        renew();
        return chunk;
      },
      /** With include_usage, when Inference sent no usage chunk: one of the gateway's count. */
      async countedUsageChunk(): Promise<StreamCompletionResponse | undefined> {
        if (!includeUsage || usageChunkSent) return undefined;
        const usage = await countedUsage(prepared, request, meter, 0, ctx.signal);
        if (usage === undefined) return undefined;
        if (usageSoFar === undefined) countedSoFar = usage;
        return create(StreamCompletionResponseSchema, { ...ids, choices: [], usage });
      },
      async activations(): Promise<StreamCompletionResponse | undefined> {
        if (replayBody === undefined) return undefined;
        const activations = await captureReplay(
          prepared,
          replayBody,
          promptIds,
          generatedIds,
          ctx.signal,
          meter,
          0,
        );
        return create(StreamCompletionResponseSchema, {
          ...ids,
          choices: [],
          activations,
          ...(continuousUsage && (usageSoFar ?? countedSoFar) !== undefined
            ? { usage: usageSoFar ?? countedSoFar }
            : {}),
        });
      },
    };
  }

  /**
   * A lens fan-out's chunks (proto/API.md §6): the parts stream at most `fanOutConcurrency` at
   * once and their chunks interleave as they come, each choice renumbered to its part's index; a
   * capture's activations for a choice come in a chunk of their own after that choice's last text
   * chunk, once its replay is done (`choices: [{index, text: "", activations}]`; other parts' chunks
   * may come in between); with include_usage, the usage chunk (summed over the parts) comes last.
   * With continuous_usage_stats every chunk of a choice carries that choice's usage so far, as
   * vLLM's chunks of a request of several prompts or n > 1 do (its prompt's tokens, the tokens it
   * generated so far). The first failing part aborts the others.
   */
  async function* streamFanOut(
    prepared: Prepared,
    parts: readonly FanOutPart[],
    request: CreateCompletionRequest,
    ctx: CallContext,
    meter: UsageMeter,
  ): AsyncGenerator<StreamCompletionResponse> {
    const includeUsage = request.streamOptions?.includeUsage === true;
    const continuousUsage = includeUsage && request.streamOptions?.continuousUsageStats === true;
    const returnTokenIds = request.returnTokenIds === true;
    const ids = completionIds(request.model);
    const renew = holdRenewer(prepared.hold, meter);
    /** Each part's last usage from Inference (with continuous_usage_stats: that choice's so far). */
    const latest: (Usage | undefined)[] = parts.map(() => undefined);
    /** Part i's usage so far: Inference's, else the gateway's count (a fan-out's prompts are exact). */
    const usageOfPart = (i: number): Usage | undefined => latest[i] ?? usageOf(meter.countedUsage(i));
    const usageOfAll = (): Usage =>
      sumUsage(parts.map((_, i) => usageOfPart(i)).filter((u): u is Usage => u !== undefined));
    const sources = parts.map(
      (part, i) =>
        async function* (signal: AbortSignal): AsyncGenerator<StreamCompletionResponse> {
          let promptIds: number[] = [];
          const generatedIds: number[] = [];
          const body = upstreamStreamBody(part.body, continuousUsage);
          const offsets = new TextOffsets();
          for await (const upstreamChunk of upstreamStream(prepared, body, signal, meter, i)) {
            const chunk = meteredChunk(prepared, upstreamChunk, ids, offsets, meter, i);
            if (chunk.usage !== undefined) latest[i] = chunk.usage;
            if (chunk.choices.length === 0) continue;
            for (const choice of chunk.choices) {
              choice.index = part.index;
              if (prepared.capture) {
                if (choice.promptTokenIds.length > 0) promptIds = [...choice.promptTokenIds];
                generatedIds.push(...choice.tokenIds);
              }
              if (!returnTokenIds) {
                if (choice.tokenIds.length > 0) choice.tokenIds = [];
                if (choice.promptTokenIds.length > 0) choice.promptTokenIds = [];
              }
            }
            // As vLLM for a request of several prompts or n > 1: the usage so far of this chunk's
            // choice (its prompt's tokens, what it generated so far).
            chunk.usage = continuousUsage ? usageOfPart(i) : undefined;
            yield chunk;
          }
          if (prepared.capture) {
            const activations = await captureReplay(
              prepared,
              body,
              promptIds,
              generatedIds,
              signal,
              meter,
              i,
            );
            yield create(StreamCompletionResponseSchema, {
              ...ids,
              choices: [create(CompletionChoiceSchema, { index: part.index, activations })],
              ...(continuousUsage && usageOfPart(i) !== undefined ? { usage: usageOfPart(i) } : {}),
            });
          }
        },
    );
    for await (const chunk of mergeLimited(sources, partsAtOnce(prepared), ctx.signal)) {
      renew();
      const stands = holdStands(prepared.hold);
      if (stands !== true) await stands;
      yield chunk;
    }
    if (includeUsage)
      yield create(StreamCompletionResponseSchema, { ...ids, choices: [], usage: usageOfAll() });
  }

  /** Whether `key` may use `model` (keys off: every model); other ledger errors are thrown. */
  async function mayUse(key: KeyInfo | undefined, model: ServedModel<VllmClient>): Promise<boolean> {
    if (key === undefined || ledger === undefined) return true;
    try {
      await ledger.checkModel(key, model.id, model.aliases);
      return true;
    } catch (err) {
      if (err instanceof ApiError && err.code === "model_not_allowed") return false;
      throw err;
    }
  }

  async function listModels(ctx: CallContext): Promise<ListModelsResponse> {
    const key = await recorded(ctx, authenticate(ctx));
    if (key !== undefined && ctx.record !== undefined) ctx.record.keyName = key.name ?? key.id;
    // A key with an allow-list sees the models it may use (by id or alias), as OpenAI lists a
    // key's models; `GET /v1/models/{id}` of another is then 404 `model_not_found`.
    const visible: ServedModel<VllmClient>[] = [];
    for (const m of models.list()) if (await mayUse(key, m)) visible.push(m);
    return create(ListModelsResponseSchema, {
      data: visible.map((m) =>
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
    ...createTokenizeCalls({ models, ledger }),
  };
}
