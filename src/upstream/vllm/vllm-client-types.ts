// The interface of a client of one Inference server, its options and its per-call options (made by
// createVllmClient, also met by the replica pool of src/upstream/pool).

import type { UpstreamTracer } from "../../core/index.js";
import type { TokenizeCache } from "./create-tokenize-cache.js";
import type {
  VllmCompletion,
  VllmCompletionChunk,
  VllmCompletionRequest,
  VllmDetokenizeRequest,
  VllmDetokenizeResponse,
  VllmModelList,
  VllmTokenizeRequest,
  VllmTokenizeResponse,
} from "./types.js";

/** Options of {@link createVllmClient}. Times in milliseconds. */
export interface VllmClientOptions {
  /** Inference's root URL, without `/v1` (e.g. `http://10.0.0.5:8000`); a path prefix is kept. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>` (vLLM `--api-key`). */
  apiKey?: string;
  /**
   * Most connections to this server for completions, i.e. concurrent completions (an HTTP/1.1
   * stream holds one connection): set it to what Inference accepts, so that the queue is
   * Inference's and not a hidden one here. @default {@link DEFAULT_MAX_CONCURRENT_COMPLETIONS}
   */
  connections?: number;
  /**
   * Connections kept apart for the control calls (`/tokenize`, `/v1/models`, `/health`), so that
   * they never queue behind completions. @default 16
   */
  controlConnections?: number;
  /** Longest wait for a control call's whole answer (`/tokenize`, `/v1/models`), then 504. @default 30_000 */
  controlDeadlineMs?: number;
  /**
   * Longest wait for response headers. Must exceed the 14-minute non-stream deadline (undici's
   * default of 300 s would cut it short). @default 900_000 (15 min)
   */
  headersTimeoutMs?: number;
  /** Longest silence between two body reads (streams included). @default 900_000 (15 min) */
  bodyTimeoutMs?: number;
  /**
   * Longest a stream may go without an SSE event, in ms: from its dispatch to the first event, and
   * between two events until `[DONE]` (Inference's response headers alone, its SSE comments and
   * the gateway's own keepalives to its caller do not count; time the socket was paused for a slow
   * consumer does not either): then the request is aborted with {@link upstreamSilence}'s 504
   * (fault `silent`). 0 = no bound (ACS_UPSTREAM_HEADERS_TIMEOUT_MS).
   * Non-streamed calls (`complete`) are not bound by it: vLLM sends their headers only at the end.
   */
  silenceTimeoutMs: number;
  /** Longest TCP connect. @default 10_000 */
  connectTimeoutMs?: number;
  /** Bounds of the `/tokenize` LRU cache. @default 4096 entries, 64 MiB */
  tokenizeCacheEntries?: number;
  tokenizeCacheBytes?: number;
  /**
   * A `/tokenize` cache shared with other clients (the replicas of one model tokenize alike);
   * the two bounds above are then unused. @default a cache of this client's own
   */
  tokenizeCache?: TokenizeCache;
  /** Longest SSE event from Inference, in characters. @default 4 MiB */
  maxSseEventChars?: number;
}

/** Per-call options of {@link VllmClient.complete}. */
export interface CompleteOptions {
  /**
   * Aborted when the caller goes away: the upstream request is aborted, ApiError `canceled` (or
   * the signal's reason when it is a `deadline_exceeded` ApiError: the caller's deadline).
   */
  signal: AbortSignal;
  /**
   * Milliseconds to wait for the whole response: then the upstream request is aborted, 504
   * `Inference did not answer within <ms> ms.` The gateway's calls set none: the service's one
   * deadline comes with `signal`. @default no deadline of its own
   */
  deadlineMs?: number;
  /**
   * Sent as `X-Request-Id` (vllm-lens keys its state by it): an id already used by a live request
   * of this process is sent as `<id>-2`, `<id>-3`… instead (see claimUpstreamRequestId).
   */
  upstreamRequestId: string;
  /** More headers for Inference (a `traceparent`). */
  headers?: Readonly<Record<string, string>>;
  /** Traces each upstream call (the replica pool uses it; a lone client ignores it). */
  trace?: UpstreamTracer;
}

/** Per-call options of {@link VllmClient.stream}. */
export interface StreamOptions {
  /**
   * Aborted when the caller goes away: the upstream request is aborted, ApiError `canceled` (or
   * the signal's reason when it is a `deadline_exceeded` ApiError: the caller's deadline).
   */
  signal: AbortSignal;
  /** Sent as `X-Request-Id`, made unique among live requests like {@link CompleteOptions.upstreamRequestId}. */
  upstreamRequestId: string;
  /** More headers for Inference (a `traceparent`). */
  headers?: Readonly<Record<string, string>>;
  /** Traces each upstream call (the replica pool uses it; a lone client ignores it). */
  trace?: UpstreamTracer;
  /**
   * Set by a caller that passes nothing on before the stream's end (a unary call collecting it):
   * the replica pool may then fail over even after chunks were yielded, calling this first — the
   * caller drops what it collected, and the chunks that follow are the other replica's from the
   * start. A lone client ignores it.
   */
  onRestart?: () => void;
}

/** Per-call options of a caller's control call ({@link VllmClient.tokenizeText}, `detokenize`). */
export interface ControlCallOptions {
  /** Aborted when the caller goes away: the upstream request is aborted, ApiError `canceled`. */
  signal: AbortSignal;
  /** Sent as `X-Request-Id`, made unique among live requests like {@link CompleteOptions.upstreamRequestId}. */
  upstreamRequestId: string;
}

/** The result of {@link VllmClient.tokenize}. */
export interface TokenizeResult {
  /** Number of tokens (BOS included when add_special_tokens). */
  count: number;
  tokens: number[];
  /** The model's longest prompt + completion, in tokens. */
  maxModelLen: number;
}

/** The client of one Inference server (vLLM + vllm-lens). Every failure is an ApiError. */
export interface VllmClient {
  /**
   * `POST /v1/completions` without streaming (`body.stream` must be false). Throws ApiError:
   * `canceled` (signal), 504 `deadline_exceeded` (deadline or headers/body timeout; the upstream
   * request is aborted), 503/502/4xx per {@link mapUpstreamError}, 502 for a malformed body.
   */
  complete(body: VllmCompletionRequest, options: CompleteOptions): Promise<VllmCompletion>;
  /**
   * `POST /v1/completions` with streaming (`body.stream` must be true): the chunks until
   * `data: [DONE]`. Throws ApiError: an in-band error event → its mapped error; a stream that ends
   * without `[DONE]`, is reset, or carries garbage → 502 `upstream_error`; no event for
   * `silenceTimeoutMs` → 504 `deadline_exceeded` (fault `silent`); `canceled` on the signal.
   * Stopping early (break, return, throw in the loop) aborts the upstream request at once.
   */
  stream(body: VllmCompletionRequest, options: StreamOptions): AsyncIterable<VllmCompletionChunk>;
  /**
   * `POST /tokenize` (`{model, prompt, add_special_tokens}`), cached (LRU) by
   * (model, addSpecialTokens, prompt). `model` is the served model name.
   */
  tokenize(
    model: string,
    prompt: string,
    addSpecialTokens: boolean,
    signal?: AbortSignal,
  ): Promise<TokenizeResult>;
  /**
   * `POST /tokenize` as a caller asked it (the REST route and the Tokenize RPC): not cached, with
   * the caller's request id; vLLM's answer, `token_strs` included when asked for.
   */
  tokenizeText(body: VllmTokenizeRequest, options: ControlCallOptions): Promise<VllmTokenizeResponse>;
  /** `POST /detokenize` (`{model, tokens}` → `{prompt}`). */
  detokenize(body: VllmDetokenizeRequest, options: ControlCallOptions): Promise<VllmDetokenizeResponse>;
  /** `GET /v1/models`. */
  listModels(signal?: AbortSignal): Promise<VllmModelList>;
  /** `GET /health` answered 200 within 5 s and before `signal` aborts (never throws). */
  health(signal?: AbortSignal): Promise<boolean>;
  /** Closes the pool once in-flight requests have finished. */
  close(): Promise<void>;
}
