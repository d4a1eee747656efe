export {
  ApiError,
  type ErrorEnvelopeJson,
  invalidRequest,
  type RetryAdvice,
  retryHeaders,
  toApiError,
} from "./api-error.js";
export { type ErrorCode, type ErrorKind, type ErrorType, errorCatalogue } from "./catalogue.js";
export { clip, MAX_ECHO_CHARS, MAX_UPSTREAM_MESSAGE_CHARS } from "./clip.js";
export {
  callerDeadlineExceeded,
  corruptEncoding,
  inferenceDeadlineExceeded,
  requestEncodings,
  requestTooLarge,
  unsupportedEncoding,
} from "./protocol-errors.js";
export { isRequestId, newRequestId, randomHex32 } from "./request-id.js";
