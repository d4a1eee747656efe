// A lens fan-out streamed (proto/API.md §6): the parts' streams merged as their chunks come.
import { create } from "@bufbuild/protobuf";
import {
  CompletionChoiceSchema,
  type CreateCompletionRequest,
  type StreamCompletionResponse,
  StreamCompletionResponseSchema,
  type Usage,
} from "../../../gen/acs/v1/completions_pb.js";
import type { CompletionIds } from "../../upstream/index.js";
import { type FanOutPart, mergeLimited } from "../lens-fan-out.js";
import type { CallContext } from "../types.js";
import type { UsageMeter } from "../usage-meter.js";
import type { Prepared } from "./call-types.js";
import { holdRenewer, holdStands } from "./hold.js";
import {
  captureReplay,
  completionIds,
  meteredChunk,
  type StreamPart,
  upstreamStream,
} from "./inference-calls.js";
import { partsAtOnce } from "./prepare.js";
import type { ServiceEnv } from "./service-env.js";
import { sumUsage, usageOf } from "./usage.js";

/** What every part of one streamed fan-out shares. */
interface FanOutStream {
  readonly env: ServiceEnv;
  readonly prepared: Prepared;
  readonly meter: UsageMeter;
  readonly ids: CompletionIds;
  readonly continuousUsage: boolean;
  readonly returnTokenIds: boolean;
  /** Part i's usage so far: Inference's, else the gateway's count (a fan-out's prompts are exact). */
  readonly usageOfPart: (i: number) => Usage | undefined;
  /** Each part's last usage from Inference (with continuous_usage_stats: that choice's so far). */
  readonly latest: (Usage | undefined)[];
}

/**
 * Part `i`'s chunks: its choice renumbered to the part's index, token ids dropped unless asked,
 * the usage so far of its choice with continuous_usage_stats; a capture's activations in a chunk
 * of their own after its last text chunk, once its replay is done.
 */
async function* partChunks(
  s: FanOutStream,
  part: FanOutPart,
  i: number,
  signal: AbortSignal,
): AsyncGenerator<StreamCompletionResponse> {
  const { prepared, meter } = s;
  const seen = { promptIds: [] as number[], generatedIds: [] as number[] };
  const stream: StreamPart = { body: part.body, ids: s.ids, continuousUsage: s.continuousUsage };
  const upstream = upstreamStream(prepared, stream, signal, meter, i);
  for await (const upstreamChunk of { [Symbol.asyncIterator]: () => upstream }) {
    const chunk = meteredChunk(prepared, upstreamChunk, meter, i);
    if (chunk.usage !== undefined) s.latest[i] = chunk.usage;
    if (chunk.choices.length === 0) continue;
    for (const choice of chunk.choices) {
      choice.index = part.index;
      if (prepared.capture) {
        if (choice.promptTokenIds.length > 0) seen.promptIds = [...choice.promptTokenIds];
        seen.generatedIds.push(...choice.tokenIds);
      }
      if (!s.returnTokenIds) {
        if (choice.tokenIds.length > 0) choice.tokenIds = [];
        if (choice.promptTokenIds.length > 0) choice.promptTokenIds = [];
      }
    }
    // As vLLM for a request of several prompts or n > 1: the usage so far of this chunk's
    // choice (its prompt's tokens, what it generated so far).
    chunk.usage = s.continuousUsage ? s.usageOfPart(i) : undefined;
    yield chunk;
  }
  if (!prepared.capture) return;
  const activations = await captureReplay(
    prepared,
    stream,
    seen,
    signal,
    meter,
    i,
    s.env.nonStreamDeadlineMs,
  );
  const usage = s.usageOfPart(i);
  yield create(StreamCompletionResponseSchema, {
    ...s.ids,
    choices: [create(CompletionChoiceSchema, { index: part.index, activations })],
    ...(s.continuousUsage && usage !== undefined ? { usage } : {}),
  });
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
export async function* streamFanOut(
  env: ServiceEnv,
  prepared: Prepared,
  parts: readonly FanOutPart[],
  request: CreateCompletionRequest,
  ctx: CallContext,
  meter: UsageMeter,
): AsyncGenerator<StreamCompletionResponse> {
  const includeUsage = request.streamOptions?.includeUsage === true;
  const latest: (Usage | undefined)[] = parts.map(() => undefined);
  const s: FanOutStream = {
    env,
    prepared,
    meter,
    ids: completionIds(request.model),
    continuousUsage: includeUsage && request.streamOptions?.continuousUsageStats === true,
    returnTokenIds: request.returnTokenIds === true,
    latest,
    usageOfPart: (i) => latest[i] ?? usageOf(meter.countedUsage(i)),
  };
  const renew = holdRenewer(env, prepared.hold, meter);
  const sources = parts.map((part, i) => (signal: AbortSignal) => partChunks(s, part, i, signal));
  for await (const chunk of mergeLimited(sources, partsAtOnce(env, prepared), ctx.signal)) {
    renew();
    const stands = holdStands(env, prepared.hold);
    if (stands !== true) await stands;
    yield chunk;
  }
  if (includeUsage) {
    const usages = parts.map((_, i) => s.usageOfPart(i)).filter((u): u is Usage => u !== undefined);
    yield create(StreamCompletionResponseSchema, { ...s.ids, choices: [], usage: sumUsage(usages) });
  }
}
