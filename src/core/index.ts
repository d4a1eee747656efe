// Pieces every layer may use, with no gateway import but src/core/errors: the record of one call (what
// the service tells the access log, metrics and traces), how an upstream call is traced, request
// bodies' Content-Encoding, the process-wide unique X-Request-Id of each upstream request, and a
// connect-es handler's description carried over to a wrapper.
export type { CallRecord } from "./call-record.js";
export {
  type BodyEncoding,
  decodeContentEncoding,
  inflateBounded,
  parseContentEncoding,
} from "./content-encoding.js";
export { createShutdownLink, type ShutdownLink } from "./shutdown-link.js";
export { asHandlerOf } from "./universal-handler.js";
export {
  claimUpstreamRequestId,
  liveUpstreamRequestIds,
  releaseUpstreamRequestId,
  upstreamRequestIdGroups,
} from "./upstream-request-ids.js";
export type { UpstreamCallInfo, UpstreamCallTrace, UpstreamTracer } from "./upstream-trace.js";
