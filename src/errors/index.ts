export { ApiError, type ErrorEnvelopeJson, invalidRequest, toApiError } from "./api-error.js";
export { type ErrorCode, type ErrorKind, type ErrorType, errorCatalogue } from "./catalogue.js";
export { clip, MAX_ECHO_CHARS, MAX_UPSTREAM_MESSAGE_CHARS } from "./clip.js";
export { isRequestId, newRequestId } from "./request-id.js";
