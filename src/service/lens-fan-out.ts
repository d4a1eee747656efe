// The lens fan-out of proto/API.md §6: vllm-lens captures and steers only one prompt with n = 1,
// so a request with output_residual_stream or apply_steering_vectors and several prompts and/or
// n > 1 becomes one Inference request per prompt × sample, each with n = 1, run at most
// `concurrency` at a time; their outputs are merged into the caller's one completion.
import pLimit from "p-limit";
import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../core/errors/index.js";
import type { Inference, InferenceRequest } from "../upstream/index.js";
import type { RequestShape } from "./checks.js";

/** One upstream request of a fan-out: the choice it produces and its body. */
export interface FanOutPart {
  /** The caller's choice index: prompt_index × n + sample_index (OpenAI's order). */
  readonly index: number;
  /** Which prompt of the request (0-based). */
  readonly prompt: number;
  /** The Inference request: that prompt alone, n = 1, seed + sample_index when a seed was given. */
  readonly body: InferenceRequest;
}

/**
 * Whether a request fans out: capture or steering with several prompts and/or n > 1. A one-prompt
 * n = 1 request goes to Inference as one request, as does every request without lens fields.
 */
export function isLensFanOut(request: CreateCompletionRequest, shape: RequestShape): boolean {
  const lens = request.outputResidualStream !== undefined || request.applySteeringVectors.length > 0;
  return lens && (shape.prompts > 1 || shape.n > 1);
}

/** The largest seed (int64), proto/API.md §2. */
const maxSeed = 2n ** 63n - 1n;

/**
 * The seed rule of a fan-out (sample k uses seed s + k) must keep every sample's seed in range:
 * with n samples, seed ≤ 2^63 − n. Throws ApiError 400 `invalid_request`, param `seed`, before
 * anything reaches Inference (which would refuse sample k's seed in its own words, after the
 * samples before it ran). A no-op for a request that does not fan out or has no seed.
 */
export function checkFanOutSeed(request: CreateCompletionRequest, shape: RequestShape): void {
  if (request.seed === undefined || shape.n <= 1 || !isLensFanOut(request, shape)) return;
  const last = request.seed + BigInt(shape.n - 1);
  if (last <= maxSeed) return;
  throw new ApiError(
    "invalid_request",
    `A request that captures or steers with n = ${shape.n} runs its samples with seeds seed, seed + 1, …, seed + ${shape.n - 1}, so seed must be at most ${maxSeed - BigInt(shape.n - 1)}, but it is ${request.seed}.`,
    { param: "seed" },
  );
}

/**
 * The parts of a fan-out of `body` (the request's whole Inference request, all prompts, n =
 * shape.n): for prompt p and sample k, part p × n + k runs that prompt alone with n = 1 and seed +
 * k when the request has a seed ({@link Inference.fanOut}).
 */
export function fanOutParts(inference: Inference, body: InferenceRequest, shape: RequestShape): FanOutPart[] {
  return inference.fanOut(body, shape.prompts, shape.n).map((part, index) => ({
    index,
    prompt: Math.floor(index / shape.n),
    body: part,
  }));
}

/** At most this many items wait in the merge's queue before a source is held up (backpressure). */
const queueHighWater = 64;

/**
 * Runs `sources` at most `concurrency` at a time (p-limit) and yields their items as they come
 * (each source's own items in its order). Each source gets an AbortSignal that aborts when `signal`
 * does, when another source fails, or when the consumer stops early. The first failure of a source
 * (or `signal`'s abort) aborts every other source and is thrown once all of them have ended, so a
 * caller's `finally` that settles a Hold runs after the last upstream request is over. A consumer
 * that stops early (return) also waits for every source to end.
 */
export async function* mergeLimited<T>(
  sources: readonly ((signal: AbortSignal) => AsyncIterable<T>)[],
  concurrency: number,
  signal: AbortSignal,
): AsyncGenerator<T> {
  const controller = new AbortController();
  const onAbort = (): void => controller.abort(signal.reason);
  if (signal.aborted) onAbort();
  else signal.addEventListener("abort", onAbort, { once: true });
  const queue: T[] = [];
  let failure: { readonly err: unknown } | undefined;
  let done = false;
  let wake: (() => void) | undefined;
  const spaceWaiters: (() => void)[] = [];
  const notify = (): void => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const freeSpace = (): void => {
    for (const w of spaceWaiters.splice(0)) w();
  };
  const limit = pLimit(concurrency);
  const all = Promise.all(
    sources.map((source) =>
      limit(async () => {
        if (controller.signal.aborted) return;
        for await (const item of source(controller.signal)) {
          queue.push(item);
          notify();
          while (queue.length >= queueHighWater && !controller.signal.aborted) {
            await new Promise<void>((resolve) => spaceWaiters.push(resolve));
          }
          // Stopped (a failure elsewhere, the caller, the consumer): end the source, and so its upstream request.
          if (controller.signal.aborted) return;
        }
      }).catch((err: unknown) => {
        failure ??= { err };
        controller.abort(err);
        freeSpace();
        notify();
      }),
    ),
  ).then(() => {
    done = true;
    notify();
  });
  try {
    for (;;) {
      if (failure !== undefined) throw failure.err;
      if (queue.length > 0) {
        const item = queue.shift() as T;
        freeSpace();
        yield item;
        continue;
      }
      if (done) {
        if (signal.aborted) throw signal.reason;
        return;
      }
      await new Promise<void>((resolve) => {
        wake = resolve;
      });
    }
  } finally {
    if (!done) controller.abort(signal.aborted ? signal.reason : new Error("fan-out stopped"));
    freeSpace();
    await all;
    signal.removeEventListener("abort", onAbort);
  }
}
