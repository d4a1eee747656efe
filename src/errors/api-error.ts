import { type ErrorCode, type ErrorType, errorCatalogue } from "./catalogue.js";

/** The JSON error envelope of API.md §7: all four keys always present. */
export interface ErrorEnvelopeJson {
  error: { message: string; type: ErrorType; param: string | null; code: string | null };
  request_id: string;
}

/**
 * The one error class of the gateway. Status, type and Connect code follow from `code` through
 * the closed catalogue; each edge converts it (REST: JSON envelope; Connect: ConnectError with
 * an acs.v1.ErrorEnvelope detail; SSE: one data event).
 */
export class ApiError extends Error {
  override readonly name = "ApiError";
  readonly code: ErrorCode;
  /** The request field at fault (`max_tokens`, `apply_steering_vectors[0].scale`), or null. */
  readonly param: string | null;
  /**
   * Seconds after which a retry may succeed, for a refusal that is about the moment, not the
   * request (429 `rate_limited`): sent as `Retry-After` (REST) and `retry-after` metadata
   * (Connect/gRPC). Undefined for every other error.
   */
  readonly retryAfterSeconds: number | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options: { param?: string | null; cause?: unknown; retryAfterSeconds?: number } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.param = options.param ?? null;
    this.retryAfterSeconds = options.retryAfterSeconds;
  }

  /** HTTP status of the REST response. */
  get status(): number {
    return errorCatalogue[this.code].status;
  }

  /** OpenAI error type. */
  get type(): ErrorType {
    return errorCatalogue[this.code].type;
  }

  /** The envelope for `requestId` (req_ + 32 hex). */
  toEnvelope(requestId: string): ErrorEnvelopeJson {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
      request_id: requestId,
    };
  }
}

/** Shorthand for the most common refusal: 400 `invalid_request` naming `param`. */
export function invalidRequest(param: string | null, message: string): ApiError {
  return new ApiError("invalid_request", message, { param });
}

/**
 * Any thrown value as an ApiError: ApiErrors pass through; anything else becomes 500
 * `internal_error` with a generic message (the cause is kept for logs, never shown to callers).
 */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  return new ApiError("internal_error", "The server had an error while processing your request.", {
    cause: err,
  });
}
