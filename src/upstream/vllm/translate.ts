// The Inference port (src/upstream/port.ts) over vLLM's HTTP API with vllm-lens: the one place
// where a proto request becomes a vLLM body (buildVllmRequest, vllm-lens xargs, the fan-out's and a
// replay's bodies) and vLLM's JSON becomes proto messages (chunks with text offsets, completions,
// activations, token counts).
import { create } from "@bufbuild/protobuf";
import {
  type DetokenizeRequest,
  type DetokenizeResponse,
  DetokenizeResponseSchema,
  type StreamCompletionResponse,
  type TokenizeRequest,
  type TokenizeResponse,
  TokenizeResponseSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { type Activations, ActivationsSchema } from "../../../gen/acs/v1/lens_pb.js";
import { ApiError } from "../../core/errors/index.js";
import { lensVllmXargs, tensorFromVllmLensJson } from "../../lens/index.js";
import type {
  CompleteAnswer,
  CompleteCall,
  CompletionIds,
  Inference,
  InferenceCall,
  InferenceCompletion,
  InferenceRequest,
  ReplayAnswer,
  StreamCall,
} from "../port.js";
import { buildVllmRequest } from "./build-vllm-request.js";
import { TextOffsets } from "./text-offsets.js";
import { toCompletionResponse, toStreamChunk } from "./to-completion-response.js";
import type { VllmCompletionChunk, VllmCompletionRequest } from "./types.js";
import type { CompleteOptions, StreamOptions, VllmClient } from "./vllm-client-types.js";

/** The vLLM body behind an {@link InferenceRequest} (the port's opaque handle is this body). */
const bodyOf = (request: InferenceRequest): VllmCompletionRequest =>
  request as unknown as VllmCompletionRequest;
const requestOf = (body: VllmCompletionRequest): InferenceRequest => body as unknown as InferenceRequest;

/** The vLLM body of a checked completion: the request's fields, max_tokens and the vllm-lens xargs. */
function prepare(completion: InferenceCompletion): InferenceRequest {
  const { request, servedModelName, maxTokens, stream, numLayers, steering } = completion;
  return requestOf(
    buildVllmRequest(request, {
      servedModelName,
      maxTokens,
      stream,
      vllmXargs: lensVllmXargs(request, { numLayers }, steering),
    }),
  );
}

/**
 * The parts of a fan-out of a body (all prompts, n): for prompt p and sample k, part p × n + k with
 * that prompt (text or token ids), n = 1, and `seed` = seed + k (exact, a bigint) when the body has
 * a seed. Every other field (vllm_xargs with the steering vectors and the capture) is the same
 * object in each part.
 */
function fanOut(request: InferenceRequest, prompts: number, n: number): InferenceRequest[] {
  const body = bodyOf(request);
  const each: VllmCompletionRequest["prompt"][] =
    prompts === 1 ? [body.prompt] : (body.prompt as string[] | number[][]);
  const parts: InferenceRequest[] = [];
  for (const prompt of each) {
    for (let k = 0; k < n; k++) {
      const part: VllmCompletionRequest = { ...body, prompt, n: 1 };
      if (body.seed !== undefined) part.seed = body.seed + BigInt(k);
      parts.push(requestOf(part));
    }
  }
  return parts;
}

/**
 * The streamed upstream body: streamed, with token ids and the usage chunk always (what was
 * generated is known at every moment), usage on every chunk only with `continuousUsage`.
 */
function streamBody(body: VllmCompletionRequest, continuousUsage: boolean): VllmCompletionRequest {
  return {
    ...body,
    stream: true,
    return_token_ids: true,
    stream_options: { include_usage: true, continuous_usage_stats: continuousUsage },
  };
}

/** The client's options of one call. */
function callOptions(call: InferenceCall): StreamOptions {
  const { signal, upstreamRequestId, trace } = call;
  return trace === undefined ? { signal, upstreamRequestId } : { signal, upstreamRequestId, trace };
}

/**
 * vLLM's chunks as proto chunks, one conversion per `next()` (no generator layer: each would keep a
 * pending request, its promise and an async frame from one chunk to the next). A chunk that cannot
 * be converted (finish_reason `abort`) closes the upstream request before its error is thrown.
 */
class ProtoChunks implements AsyncIterator<StreamCompletionResponse> {
  readonly #upstream: AsyncIterator<VllmCompletionChunk>;
  readonly #ids: CompletionIds;
  /** The stream's one TextOffsets; a fresh one after a failover restarted the stream. */
  offsets = new TextOffsets();

  constructor(upstream: AsyncIterable<VllmCompletionChunk>, ids: CompletionIds) {
    this.#upstream = upstream[Symbol.asyncIterator]();
    this.#ids = ids;
  }

  async next(): Promise<IteratorResult<StreamCompletionResponse>> {
    const step = await this.#upstream.next();
    if (step.done === true) return { done: true, value: undefined };
    let chunk: StreamCompletionResponse;
    try {
      chunk = toStreamChunk(step.value, this.#ids, this.offsets);
    } catch (err) {
      await this.#upstream.return?.().catch(() => undefined);
      throw err;
    }
    return { done: false, value: chunk };
  }

  async return(): Promise<IteratorResult<StreamCompletionResponse>> {
    await this.#upstream.return?.();
    return { done: true, value: undefined };
  }
}

/** A capture's residual stream from vllm-lens's `activations`; 502 `upstream_error` when absent. */
function residualStream(activations: unknown): Activations {
  const rs = (activations as { residual_stream?: unknown } | null | undefined)?.residual_stream;
  if (rs === undefined || rs === null) {
    throw new ApiError("upstream_error", "Inference returned no activations for a capture request.");
  }
  return create(ActivationsSchema, { residualStream: tensorFromVllmLensJson(rs) });
}

/** The replay body of a streamed capture (see {@link Inference.replay}). */
function replayBody(
  body: VllmCompletionRequest,
  continuousUsage: boolean,
  promptIds: readonly number[],
  generatedIds: readonly number[],
): VllmCompletionRequest {
  const replay: VllmCompletionRequest = {
    ...streamBody(body, continuousUsage),
    prompt: [...promptIds, ...generatedIds.slice(0, -1)],
    max_tokens: 1,
    min_tokens: 0,
    n: 1,
    stream: false,
    echo: false,
    add_special_tokens: false,
    return_token_ids: false,
  };
  delete replay.stream_options;
  delete replay.logprobs;
  delete replay.prompt_logprobs;
  return replay;
}

/**
 * The Inference port over one vLLM client (a server, or a model's replica pool, which meets the
 * same interface). `client` is kept as `upstream` for the wiring (health, close, replica state).
 */
export class VllmInference<Client extends VllmClient = VllmClient> implements Inference {
  constructor(readonly upstream: Client) {}

  prepare(completion: InferenceCompletion): InferenceRequest {
    return prepare(completion);
  }

  fanOut(request: InferenceRequest, prompts: number, n: number): InferenceRequest[] {
    return fanOut(request, prompts, n);
  }

  stream(request: InferenceRequest, call: StreamCall): AsyncIterator<StreamCompletionResponse> {
    const options = callOptions(call);
    let chunks: ProtoChunks | undefined;
    const onRestart = call.onRestart;
    if (onRestart !== undefined) {
      options.onRestart = () => {
        if (chunks !== undefined) chunks.offsets = new TextOffsets();
        onRestart();
      };
    }
    chunks = new ProtoChunks(
      this.upstream.stream(streamBody(bodyOf(request), call.continuousUsage), options),
      call.ids,
    );
    return chunks;
  }

  async complete(request: InferenceRequest, model: string, call: CompleteCall): Promise<CompleteAnswer> {
    const options: CompleteOptions = callOptions(call);
    const v = await this.upstream.complete({ ...bodyOf(request), return_token_ids: true }, options);
    return { response: toCompletionResponse(v, model), activations: () => residualStream(v.activations) };
  }

  async replay(
    request: InferenceRequest,
    continuousUsage: boolean,
    promptIds: readonly number[],
    generatedIds: readonly number[],
    call: CompleteCall,
  ): Promise<ReplayAnswer> {
    const body = replayBody(bodyOf(request), continuousUsage, promptIds, generatedIds);
    const v = await this.upstream.complete(body, callOptions(call));
    return {
      promptTokens: v.usage?.prompt_tokens ?? body.prompt.length,
      activations: () => residualStream(v.activations),
    };
  }

  tokenize(model: string, prompt: string, addSpecialTokens: boolean, signal?: AbortSignal) {
    return this.upstream.tokenize(model, prompt, addSpecialTokens, signal);
  }

  async tokenizeText(
    model: string,
    request: TokenizeRequest,
    call: InferenceCall,
  ): Promise<TokenizeResponse> {
    const returnTokenStrs = request.returnTokenStrs === true;
    const answer = await this.upstream.tokenizeText(
      {
        model,
        prompt: request.prompt ?? "",
        add_special_tokens: request.addSpecialTokens ?? true,
        return_token_strs: returnTokenStrs,
      },
      { signal: call.signal, upstreamRequestId: call.upstreamRequestId },
    );
    return create(TokenizeResponseSchema, {
      count: answer.count,
      maxModelLen: answer.max_model_len,
      tokens: answer.tokens,
      tokenStrs: returnTokenStrs ? (answer.token_strs ?? []) : [],
    });
  }

  async detokenize(
    model: string,
    request: DetokenizeRequest,
    call: InferenceCall,
  ): Promise<DetokenizeResponse> {
    const answer = await this.upstream.detokenize(
      { model, tokens: request.tokens },
      { signal: call.signal, upstreamRequestId: call.upstreamRequestId },
    );
    return create(DetokenizeResponseSchema, { prompt: answer.prompt });
  }

  /** True while at least one of the client's servers is up (a lone server: always). */
  serving(): boolean {
    const upstream = this.upstream as Partial<{ serving(): boolean }>;
    return upstream.serving?.() ?? true;
  }
}
