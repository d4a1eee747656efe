import type { ErrorCode } from "./errors/index.js";
import type { UpstreamTracer } from "./upstream-trace.js";

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
