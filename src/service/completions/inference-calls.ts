// A prepared completion's calls to its model's Inference port (src/upstream/port.ts), metered: the
// stream (each chunk counted on the usage meter), and a streamed capture's replay.
import type { StreamCompletionResponse } from "../../../gen/acs/v1/completions_pb.js";
import type { Activations } from "../../../gen/acs/v1/lens_pb.js";
import {
  type CompletionIds,
  type InferenceCall,
  type InferenceRequest,
  newCompletionId,
  type StreamCall,
} from "../../upstream/index.js";
import type { UsageMeter } from "../usage-meter.js";
import { underDeadline } from "./call-deadline.js";
import { markFirstToken } from "./call-record.js";
import type { Prepared } from "./call-types.js";

/** The ids of a fresh completion of `model` (as the caller named it). */
export function completionIds(model: string): CompletionIds {
  return { id: newCompletionId(), created: BigInt(Math.floor(Date.now() / 1000)), model };
}

/** The options of one upstream call of a prepared request: `signal`, its X-Request-Id and its tracer. */
export function inferenceCall(prepared: Prepared, signal: AbortSignal): InferenceCall {
  const upstreamRequestId = prepared.nextUpstreamId();
  const trace = prepared.ctx.record?.traceUpstream;
  return trace === undefined ? { signal, upstreamRequestId } : { signal, upstreamRequestId, trace };
}

/** What {@link upstreamStream} streams: the request, the caller's ids and the usage it asks for. */
export interface StreamPart {
  readonly body: InferenceRequest;
  readonly ids: CompletionIds;
  /** Usage on every chunk (continuous_usage_stats). */
  readonly continuousUsage: boolean;
  /** See {@link StreamCall.onRestart}. */
  readonly onRestart?: () => void;
}

/**
 * Inference's stream of `stream.body`, metered on part `part` from its first chunk. Each chunk goes
 * through {@link meteredChunk} in the caller's loop (no generator layer of its own between the
 * port's stream and the caller: this runs per chunk).
 */
export function upstreamStream(
  prepared: Prepared,
  stream: StreamPart,
  signal: AbortSignal,
  meter: UsageMeter,
  part: number,
): AsyncIterator<StreamCompletionResponse> {
  meter.markStarted(part);
  const call: StreamCall = {
    ...inferenceCall(prepared, signal),
    ids: stream.ids,
    continuousUsage: stream.continuousUsage,
  };
  return prepared.model.client.stream(
    stream.body,
    stream.onRestart === undefined ? call : { ...call, onRestart: stream.onRestart },
  );
}

/**
 * One chunk of Inference's stream, metered on part `part`: its generated tokens counted, a prompt's
 * exact tokens noted, the first token's time recorded, the usage chunk reported. The upstream
 * always streams token ids and usage, so that what was generated is known at every moment.
 */
export function meteredChunk(
  prepared: Prepared,
  chunk: StreamCompletionResponse,
  meter: UsageMeter,
  part: number,
): StreamCompletionResponse {
  for (const choice of chunk.choices) {
    meter.addGenerated(choice.tokenIds.length, part);
    if (choice.promptTokenIds.length > 0) meter.notePromptTokens(choice.index, choice.promptTokenIds.length);
  }
  if (meter.generated > 0) markFirstToken(prepared.ctx);
  if (chunk.choices.length === 0 && chunk.usage !== undefined) meter.report(chunk.usage, part);
  return chunk;
}

/**
 * A streamed capture's activations ({@link Inference.replay} of `body` with the stream's prompt
 * and generated token ids), under a deadline of `deadlineMs` of its own: the one non-streamed
 * Inference request of a stream (./call-deadline.ts {@link underDeadline}). Its prompt tokens are
 * charged as prompt tokens of meter part `part` (the Hold covered them).
 */
export async function captureReplay(
  prepared: Prepared,
  stream: StreamPart,
  ids: { readonly promptIds: readonly number[]; readonly generatedIds: readonly number[] },
  signal: AbortSignal,
  meter: UsageMeter,
  part: number,
  deadlineMs: number,
): Promise<Activations> {
  const answer = await underDeadline(signal, deadlineMs, (replaySignal) =>
    prepared.model.client.replay(
      stream.body,
      stream.continuousUsage,
      ids.promptIds,
      ids.generatedIds,
      inferenceCall(prepared, replaySignal),
    ),
  );
  meter.addReplay(answer.promptTokens, part);
  return answer.activations();
}
