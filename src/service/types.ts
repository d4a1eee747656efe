import type {
  CreateCompletionRequest,
  CreateCompletionResponse,
  DetokenizeRequest,
  DetokenizeResponse,
  ListModelsResponse,
  StreamCompletionResponse,
  TokenizeRequest,
  TokenizeResponse,
} from "../../gen/acs/v1/completions_pb.js";
import type { ErrorCode } from "../errors/index.js";
import type { UpstreamTracer } from "../upstream/index.js";

/**
 * What the service tells about one call, for the access log, the metrics and the traces
 * (src/telemetry reads it when the response ends). The service sets each field when it knows it.
 */
export interface CallRecord {
  /** The served model's id, once the request named one that exists. */
  model?: string;
  /** The name of the caller's key (never the key itself); its id when it has no name. */
  keyName?: string;
  /**
   * Σ prompt tokens: Inference's count once it told the prompt's token ids, else as the Hold
   * counts them (a bound of a text prompt with a byte-level tokenizer, src/service/usage-meter.ts).
   */
  promptTokens?: number;
  /** Tokens generated (all choices), counted from the token ids Inference streams. */
  completionTokens?: number;
  /**
   * `performance.now()` when Inference's first generated token arrived; unset when Inference
   * answered without a stream (its first token's time is unknown).
   */
  firstTokenAt?: number;
  /** max_tokens was lowered to what the Budget holds (`X-Acs-Max-Tokens-Clamped`). */
  clamped?: boolean;
  /**
   * The error code the call ended with (src/errors catalogue), as its caller was sent it: a
   * surface that answers a call the shutdown cut short with the shutdown's error (503
   * `upstream_unavailable`) puts that code here in place of the service's `canceled`.
   */
  errorCode?: ErrorCode;
  /** Called once when a streamed completion has passed its checks (the in-flight streams gauge). */
  streamStarted?(): void;
  /**
   * True from the end of a completion's checks until the service has recorded its tokens (its
   * Inference request ended, its charge counted). A caller who goes away meanwhile is told nothing
   * more, but the access line and the token metrics wait for them ({@link CallRecord.onEnd}).
   */
  running?: boolean;
  /** Called once when `running` turns false; set by whoever waits for it (src/telemetry). */
  onEnd?: () => void;
  /** Traces each upstream call (a span and the `traceparent` Inference gets). */
  readonly traceUpstream?: UpstreamTracer;
}

/** What a surface (REST or Connect) passes into the service for one call. */
export interface CallContext {
  /**
   * The request id, already sent as X-Request-Id; the envelope's request_id: the caller's valid
   * X-Request-Id, else `req_` + 32 hex (src/telemetry/request-id.ts). Inference gets it too.
   */
  readonly requestId: string;
  /** Aborted when the caller disconnects (or the server shuts down). */
  readonly signal: AbortSignal;
  /** The raw `Authorization` header value, or undefined. */
  readonly authorization: string | undefined;
  /**
   * Sets a response header; the service calls it before the first chunk or the response
   * (e.g. `X-Acs-Max-Tokens-Clamped`). REST: an HTTP header; Connect: a response header.
   */
  setResponseHeader(name: string, value: string): void;
  /**
   * Called once every check has passed and the Hold is placed (response headers such as
   * `X-Acs-Max-Tokens-Clamped` are set by then), just before Inference is called. A streaming
   * surface may commit its status after this, not before.
   */
  onPrepared?(): void;
  /** Filled in by the service for the access log, metrics and traces. @default none */
  readonly record?: CallRecord;
}

/**
 * The service both surfaces call: the same code for REST and Connect (proto/API.md §1).
 * Every method throws ApiError (src/errors) for a refusal.
 */
export interface CompletionsApi {
  /**
   * Checks the caller's key (when keys are on), so a surface can refuse a bad key (401) before
   * it even decodes the body, as OpenAI does. Every other method checks it again.
   */
  authenticate(ctx: CallContext): Promise<void> | void;
  /** A whole completion. Throws ApiError before or after Inference answers. */
  createCompletion(request: CreateCompletionRequest, ctx: CallContext): Promise<CreateCompletionResponse>;
  /**
   * The chunks of a streamed completion. Every check that can refuse the request runs before the
   * first chunk is yielded, so a surface that waits for the first chunk before sending its status
   * turns every refusal into a real HTTP status. An error after that is thrown from the iterator.
   * Breaking out of the loop (or aborting ctx.signal) aborts the Inference request.
   */
  streamCompletion(
    request: CreateCompletionRequest,
    ctx: CallContext,
  ): AsyncIterable<StreamCompletionResponse>;
  /** The served models. */
  listModels(ctx: CallContext): Promise<ListModelsResponse>;
  /** A text's tokens, from one of the model's replicas (vLLM's `/tokenize`); nothing is charged. */
  tokenize(request: TokenizeRequest, ctx: CallContext): Promise<TokenizeResponse>;
  /** The text of token ids, from one of the model's replicas (vLLM's `/detokenize`). */
  detokenize(request: DetokenizeRequest, ctx: CallContext): Promise<DetokenizeResponse>;
}
