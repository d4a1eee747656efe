// Logs, metrics and traces of requests: the access log, the per-request Prometheus metrics, the
// request id (incoming X-Request-Id kept, sent on to Inference) and OpenTelemetry spans.
export { createLogger, type LoggerOptions } from "./logger.js";
export { type CallMetrics, createCallMetrics } from "./metrics.js";
export { isAcceptedRequestId, MAX_REQUEST_ID_LENGTH, requestIdFrom } from "./request-id.js";
export {
  callRecordOf,
  observeRequests,
  type Protocol,
  protocolOf,
  type RequestObserver,
  type RequestTelemetryDeps,
} from "./request-telemetry.js";
export { callRecordKey, type RpcOutcome, withRpcOutcome } from "./rpc-outcome.js";
export { createTracing, type Tracing, type TracingOptions } from "./tracing.js";
