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
import type { CallRecord } from "../core/index.js";

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
 * Every method throws ApiError (src/core/errors) for a refusal.
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
