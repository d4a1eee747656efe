export { createAdminConnectRoutes } from "./admin-routes.js";
export { compressionDeflate } from "./compression.js";
export { toConnectError } from "./error-conversion.js";
export { type ErrorEnvelopeOptions, withErrorEnvelopes } from "./error-envelopes.js";
export { createHealthRoutes } from "./health-routes.js";
export {
  protocolErrorResponse,
  type RpcErrorForm,
  rpcErrorForm,
  writeProtocolError,
} from "./protocol-error.js";
export { createReflectionIndex, createReflectionRoutes, type ReflectionIndex } from "./reflection-routes.js";
export { releaseParsedBody } from "./request-body.js";
export {
  type ConnectRoutesOptions,
  createConnectRoutes,
  endTransportKey,
  endWhenStalled,
  requestIdKey,
} from "./routes.js";
export { connectJsonOptions, strictJsonTextDecoder, strictJsonTextDecoderFor } from "./strict-json-text.js";
