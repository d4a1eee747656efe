// The caller's chunks of one streamed request to Inference (no fan-out): its text chunks as
// Inference streams them, usage as the caller asked, a capture's activations last.
import { create } from "@bufbuild/protobuf";
import {
  type CreateCompletionRequest,
  type StreamCompletionResponse,
  StreamCompletionResponseSchema,
  type Usage,
} from "../../../gen/acs/v1/completions_pb.js";
import type { CallContext } from "../types.js";
import type { UsageMeter } from "../usage-meter.js";
import type { Prepared } from "./call-types.js";
import { holdRenewer } from "./hold.js";
import {
  captureReplay,
  completionIds,
  meteredChunk,
  type StreamPart,
  upstreamStream,
} from "./inference-calls.js";
import type { ServiceEnv } from "./service-env.js";
import { ChoiceCounts, countedUsage } from "./usage.js";

/** The caller's side of one Inference stream: `upstream`, and what each of its chunks becomes. */
export interface SingleStream {
  /** Inference's stream (the caller's loop reads it, and closes it when it stops early). */
  readonly upstream: AsyncIterator<StreamCompletionResponse>;
  /**
   * A chunk of `upstream` as the caller's: text chunks as Inference streams them (token ids only
   * when asked; usage on every chunk only with include_usage and continuous_usage_stats both set,
   * as vLLM does), the usage chunk with include_usage, undefined for a chunk the caller does not get.
   */
  callerChunk(chunk: StreamCompletionResponse): StreamCompletionResponse | undefined;
  /** With include_usage, when Inference sent no usage chunk: one of the gateway's count (after the last). */
  countedUsageChunk(): Promise<StreamCompletionResponse | undefined>;
  /** A capture's activations in a chunk of their own (after the last); undefined without a capture. */
  activations(): Promise<StreamCompletionResponse | undefined>;
}

/** What one stream tracks between its chunks. */
interface StreamState {
  promptIds: number[];
  readonly generatedIds: number[];
  /** The last usage Inference sent (continuous_usage_stats: the usage so far). */
  usageSoFar: Usage | undefined;
  /** Whether Inference sent its usage chunk (else, with include_usage, the gateway's count is sent). */
  usageChunkSent: boolean;
  /** With continuous_usage_stats and no usage from Inference: the last chunk's counted usage. */
  countedSoFar: Usage | undefined;
}

/** Keeps a capture's token ids and drops those the caller did not ask for, on one chunk's choices. */
function trackChoices(
  chunk: StreamCompletionResponse,
  state: StreamState,
  counts: ChoiceCounts | undefined,
  capture: boolean,
  returnTokenIds: boolean,
): void {
  for (const choice of chunk.choices) {
    if (counts !== undefined && state.usageSoFar === undefined) state.countedSoFar = counts.add(choice);
    if (capture && choice.index === 0) {
      if (choice.promptTokenIds.length > 0) state.promptIds = [...choice.promptTokenIds];
      state.generatedIds.push(...choice.tokenIds);
    }
    if (!returnTokenIds) {
      if (choice.tokenIds.length > 0) choice.tokenIds = [];
      if (choice.promptTokenIds.length > 0) choice.promptTokenIds = [];
    }
  }
}

/** The {@link SingleStream} of a prepared call (its Inference stream opened here). */
export function singleStream(
  env: ServiceEnv,
  prepared: Prepared,
  request: CreateCompletionRequest,
  ctx: CallContext,
  meter: UsageMeter,
): SingleStream {
  const includeUsage = request.streamOptions?.includeUsage === true;
  const continuousUsage = includeUsage && request.streamOptions?.continuousUsageStats === true;
  const returnTokenIds = request.returnTokenIds === true;
  const ids = completionIds(request.model);
  const renew = holdRenewer(env, prepared.hold, meter);
  const state: StreamState = {
    promptIds: [],
    generatedIds: [],
    usageSoFar: undefined,
    usageChunkSent: false,
    countedSoFar: undefined,
  };
  const counts = continuousUsage ? new ChoiceCounts(prepared, meter, request.n ?? 1) : undefined;
  const stream: StreamPart = { body: prepared.body, ids, continuousUsage };
  const upstream = upstreamStream(prepared, stream, ctx.signal, meter, 0);
  return {
    upstream,
    callerChunk(upstreamChunk) {
      const chunk = meteredChunk(prepared, upstreamChunk, meter, 0);
      if (chunk.usage !== undefined) state.usageSoFar = chunk.usage;
      if (chunk.choices.length === 0) {
        if (chunk.usage === undefined) return undefined;
        state.usageChunkSent = true;
        return includeUsage ? chunk : undefined;
      }
      trackChoices(chunk, state, counts, prepared.capture, returnTokenIds);
      // Every chunk carries the usage so far (proto/API.md §5), also one Inference sent without;
      // the gateway's count of its choice when Inference sends none.
      chunk.usage = continuousUsage ? (state.usageSoFar ?? state.countedSoFar) : undefined;
      renew();
      return chunk;
    },
    async countedUsageChunk() {
      if (!includeUsage || state.usageChunkSent) return undefined;
      const usage = await countedUsage(prepared, request, meter, 0, ctx.signal);
      if (usage === undefined) return undefined;
      if (state.usageSoFar === undefined) state.countedSoFar = usage;
      return create(StreamCompletionResponseSchema, { ...ids, choices: [], usage });
    },
    async activations() {
      if (!prepared.capture) return undefined;
      const activations = await captureReplay(
        prepared,
        stream,
        state,
        ctx.signal,
        meter,
        0,
        env.nonStreamDeadlineMs,
      );
      const usage = state.usageSoFar ?? state.countedSoFar;
      return create(StreamCompletionResponseSchema, {
        ...ids,
        choices: [],
        activations,
        ...(continuousUsage && usage !== undefined ? { usage } : {}),
      });
    },
  };
}
