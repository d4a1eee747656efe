// How an upstream call is traced: the replica pool (src/upstream) starts a trace per attempt,
// src/telemetry makes the spans; neither imports the other.

/** One upstream call as a tracer sees it (the replica pool starts one per attempt). */
export interface UpstreamCallInfo {
  /** The model's id (src/config). */
  readonly model: string;
  /** The replica's base URL. */
  readonly replica: string;
  /** The `X-Request-Id` the call is sent with (before the client makes it unique, see VLLM.md). */
  readonly upstreamRequestId: string;
  /** 0 for the first replica tried, 1 for the failover. */
  readonly attempt: number;
  /** `POST /v1/completions` streamed (true) or not. */
  readonly stream: boolean;
}

/** A traced upstream call: the headers to send with it (`traceparent`, `tracestate`), and its end. */
export interface UpstreamCallTrace {
  readonly headers: Readonly<Record<string, string>>;
  /** Called once when the call ends: without an error when it succeeded. */
  end(error?: unknown): void;
}

/** Starts tracing one upstream call (src/telemetry); the replica pool calls it per attempt. */
export type UpstreamTracer = (call: UpstreamCallInfo) => UpstreamCallTrace;
