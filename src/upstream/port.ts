// The Inference port: what the completions service asks of a model's Inference servers, in proto
// terms. The service builds no upstream body and reads no upstream JSON; src/upstream/vllm/translate.ts
// implements the port over vLLM's HTTP API (with vllm-lens), and a test can implement it in memory.
import type {
  CreateCompletionRequest,
  CreateCompletionResponse,
  DetokenizeRequest,
  DetokenizeResponse,
  StreamCompletionResponse,
  TokenizeRequest,
  TokenizeResponse,
} from "../../gen/acs/v1/completions_pb.js";
import type { Activations } from "../../gen/acs/v1/lens_pb.js";
import type { UpstreamTracer } from "../core/index.js";

/** What the service decided for one completion before Inference sees it ({@link Inference.prepare}). */
export interface InferenceCompletion {
  /** The checked request: prompts and sampling as the caller sent them, min_tokens at most `maxTokens`. */
  readonly request: CreateCompletionRequest;
  /** Inference's `--served-model-name` for the requested model or alias. */
  readonly servedModelName: string;
  /** The final max_tokens (proto/API.md §3, after a Budget clamp): an integer ≥ 1. */
  readonly maxTokens: number;
  /** Whether the caller asked for a stream (the request's own form; each call says how it runs). */
  readonly stream: boolean;
  /** The model's decoder layers (a capture of all layers names each, 0 … numLayers − 1). */
  readonly numLayers: number;
  /** The steering vectors' raw bytes as the checks decoded them, in request order (not decoded again). */
  readonly steering: readonly Uint8Array[];
}

/**
 * A completion in Inference's own form, made once by {@link Inference.prepare} and sent as it is,
 * split ({@link Inference.fanOut}) or replayed; opaque to the service.
 */
export interface InferenceRequest {
  readonly [inferenceRequestBrand]: true;
}
declare const inferenceRequestBrand: unique symbol;

/** The ids shared by every chunk of the caller's completion. */
export interface CompletionIds {
  readonly id: string;
  /** Unix seconds. */
  readonly created: bigint;
  /** The model as the caller named it. */
  readonly model: string;
}

/** Per-call options of every Inference call. */
export interface InferenceCall {
  /**
   * Aborted when the caller goes away or a deadline passes: the upstream request is aborted,
   * ApiError `canceled`, or the signal's reason when it is a `deadline_exceeded` ApiError (the
   * deadline the caller set, or the service's non-stream deadline: the port keeps no deadline of
   * its own).
   */
  readonly signal: AbortSignal;
  /** Sent as `X-Request-Id` (an id a live request of this process uses gets a `-2`, `-3`… suffix). */
  readonly upstreamRequestId: string;
  /** Traces each upstream call (a replica pool's attempts). */
  readonly trace?: UpstreamTracer;
}

/** Per-call options of {@link Inference.stream}. */
export interface StreamCall extends InferenceCall {
  /** The caller's completion ids, set on every chunk. */
  readonly ids: CompletionIds;
  /** Usage on every chunk (continuous_usage_stats), else only the usage chunk at the end. */
  readonly continuousUsage: boolean;
  /**
   * Set by a caller that passes nothing on before the stream's end (a unary call collecting it):
   * the replicas may then fail over even after chunks were yielded, calling this first — the
   * caller drops what it collected; the chunks that follow are the other replica's from the start.
   */
  readonly onRestart?: () => void;
}

/**
 * Per-call options of the non-streamed calls ({@link Inference.complete}, {@link Inference.replay}):
 * those of every call; their deadline comes with the signal.
 */
export type CompleteCall = InferenceCall;

/** Inference's non-streamed answer ({@link Inference.complete}). */
export interface CompleteAnswer {
  /**
   * The completion with the caller's `model` and the gateway's id: every choice with its token ids
   * and prompt token ids, `text_offset` pointing into its text; `usage` as Inference reported it
   * (absent when it sent none); `activations` unset (see `activations`).
   */
  readonly response: CreateCompletionResponse;
  /**
   * A capture's activations. Throws ApiError 502 `upstream_error` when Inference sent none, or
   * the tensor's ApiError when they are malformed.
   */
  activations(): Activations;
}

/** The answer of a streamed capture's replay ({@link Inference.replay}). */
export interface ReplayAnswer {
  /** The replay's prompt tokens as Inference counted them (or the replayed prompt's length). */
  readonly promptTokens: number;
  /** As {@link CompleteAnswer.activations}. */
  activations(): Activations;
}

/** The result of {@link Inference.tokenize}. */
export interface TokenCount {
  /** Number of tokens (BOS included when add_special_tokens). */
  readonly count: number;
  readonly tokens: readonly number[];
  /** The model's longest prompt + completion, in tokens. */
  readonly maxModelLen: number;
}

/** The Inference servers of one model (its replicas behind one interface). Every failure is an ApiError. */
export interface Inference {
  /** The completion's Inference form. Throws ApiError 400 `invalid_request` for a tensor that does not match its shape. */
  prepare(completion: InferenceCompletion): InferenceRequest;
  /**
   * A lens fan-out's requests (proto/API.md §6): for prompt p and sample k, entry p × n + k runs
   * that prompt alone with n = 1 and seed + k (when the request has a seed); everything else the same.
   */
  fanOut(request: InferenceRequest, prompts: number, n: number): InferenceRequest[];
  /**
   * The completion streamed: proto chunks with `call.ids`, token ids and prompt token ids always,
   * the usage chunk (`choices: []`) always when Inference sends one, `text_offset` pointing into
   * each choice's text. Throws (from `next`) ApiError: an in-band error event → its mapped error, a
   * stream cut short → 502 `upstream_error`, a silent replica → 504 `deadline_exceeded`, `canceled`
   * on the signal; the upstream request is aborted when the iterator is closed early or throws.
   */
  stream(request: InferenceRequest, call: StreamCall): AsyncIterator<StreamCompletionResponse>;
  /**
   * The completion answered whole (the one form with prompt_logprobs and activations), with the
   * caller's `model`. Throws ApiError: `canceled`, 504 `deadline_exceeded` (the signal's reason, or
   * the connection's headers/body timeout), 502/503/4xx of Inference.
   */
  complete(request: InferenceRequest, model: string, call: CompleteCall): Promise<CompleteAnswer>;
  /**
   * A streamed capture's activations: one more non-streamed prefill of `promptIds` + `generatedIds`
   * − 1 with max_tokens 1 and the same steering, which gives the positions a non-streamed capture
   * returns. `continuousUsage` as the stream it replays. Throws as {@link complete}.
   */
  replay(
    request: InferenceRequest,
    continuousUsage: boolean,
    promptIds: readonly number[],
    generatedIds: readonly number[],
    call: CompleteCall,
  ): Promise<ReplayAnswer>;
  /**
   * The tokens of `prompt` (cached by model, addSpecialTokens and prompt); `model` is the served
   * model name. Throws ApiError (503 when Inference is down, `canceled` on `signal`).
   */
  tokenize(
    model: string,
    prompt: string,
    addSpecialTokens: boolean,
    signal?: AbortSignal,
  ): Promise<TokenCount>;
  /** A caller's Tokenize (`request.model` is replaced by `model`, the served name); not cached. */
  tokenizeText(model: string, request: TokenizeRequest, call: InferenceCall): Promise<TokenizeResponse>;
  /** A caller's Detokenize (`request.model` is replaced by `model`, the served name). */
  detokenize(model: string, request: DetokenizeRequest, call: InferenceCall): Promise<DetokenizeResponse>;
}
