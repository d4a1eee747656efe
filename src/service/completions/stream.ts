// StreamCompletion: one prepared call's chunks as they come — one Inference stream, or a lens
// fan-out's streams merged — each delivered only while the Hold stands; the one end in `finally`.
import type {
  CreateCompletionRequest,
  StreamCompletionResponse,
} from "../../../gen/acs/v1/completions_pb.js";
import { toApiError } from "../../core/errors/index.js";
import type { CallContext } from "../types.js";
import { recordError } from "./call-record.js";
import type { Prepared } from "./call-types.js";
import { holdStands } from "./hold.js";
import { begin } from "./prepare.js";
import type { ServiceEnv } from "./service-env.js";
import { type SingleStream, singleStream } from "./single-stream.js";
import { streamFanOut } from "./stream-fan-out.js";

/**
 * What comes after one Inference stream's last chunk: with include_usage, the usage chunk of the
 * gateway's count when Inference sent none; then a capture's activations (its replay runs only
 * after the usage chunk was delivered). Each only while the Hold stands.
 */
async function* afterLast(env: ServiceEnv, prepared: Prepared, single: SingleStream) {
  const usage = await single.countedUsageChunk();
  if (usage !== undefined) {
    const stands = holdStands(env, prepared.hold);
    if (stands !== true) await stands;
    yield usage;
  }
  const activations = await single.activations();
  if (activations !== undefined) {
    const stands = holdStands(env, prepared.hold);
    if (stands !== true) await stands;
    yield activations;
  }
}

/** StreamCompletion (proto/API.md §5): the checks, the chunks, the one end (also when the consumer stops early). */
export async function* streamCompletion(
  env: ServiceEnv,
  request: CreateCompletionRequest,
  ctx: CallContext,
): AsyncGenerator<StreamCompletionResponse> {
  const { prepared, meter, call } = await begin(env, request, ctx, true);
  let failure: unknown;
  try {
    if (prepared.parts !== undefined) {
      yield* streamFanOut(env, prepared, prepared.parts, request, ctx, meter);
      return;
    }
    // One request to Inference: its chunks are converted in this generator's loop, with no
    // generator between it and the upstream stream (each layer would keep a pending request, its
    // promise and an async frame from one chunk to the next, at every chunk).
    const single = singleStream(env, prepared, request, ctx, meter);
    const upstream = single.upstream;
    // `for await (const c of upstream)`, written out so that no chunk is held while the next is
    // awaited (`for await` keeps the last result and its variable until the next comes): a chunk
    // kept for the second or more between two outlives V8's young generation, and thousands of
    // streams then pile up garbage in the old one that only a full collection frees.
    let open = true; // left early (consumer gone, a throw here): close it, as `for await` does
    try {
      for (;;) {
        let step: IteratorResult<StreamCompletionResponse> | undefined;
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
        const stands = holdStands(env, prepared.hold);
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
    yield* afterLast(env, prepared, single);
  } catch (err) {
    failure = err;
    throw recordError(ctx, toApiError(err));
  } finally {
    // Also when the consumer stops early (a disconnect): charged what was generated so far.
    await call.end(failure);
  }
}
