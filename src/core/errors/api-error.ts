import { type ErrorCode, type ErrorType, errorCatalogue } from "./catalogue.js";

/** The JSON error envelope of proto/API.md §7: all four keys always present. */
export interface ErrorEnvelopeJson {
  error: { message: string; type: ErrorType; param: string | null; code: string | null };
  request_id: string;
}

/**
 * Whether a refused request may be sent again (429s). `{retry: false}`: not before something
 * changes (a spent Budget) — sent as `x-should-retry: false`, which the OpenAI SDKs honour.
 * `{retry: true, afterSeconds}`: the same request can succeed later (Holds of requests in flight
 * block it until they settle) — `x-should-retry: true` and `Retry-After: <afterSeconds>`.
 */
export type RetryAdvice =
  | { readonly retry: false }
  | { readonly retry: true /** Whole seconds, ≥ 1. */; readonly afterSeconds: number };

/**
 * The response headers (lower-case names) that carry `advice`: REST sends them as HTTP headers,
 * Connect as response headers (unary) or trailers (streams, gRPC). Empty without advice.
 */
export function retryHeaders(advice: RetryAdvice | undefined): Record<string, string> {
  if (advice === undefined) return {};
  if (!advice.retry) return { "x-should-retry": "false" };
  return { "x-should-retry": "true", "retry-after": String(Math.max(1, Math.ceil(advice.afterSeconds))) };
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
  /** Whether the caller may retry (see {@link retryHeaders}); undefined: no advice given. */
  readonly retry: RetryAdvice | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options: { param?: string | null; cause?: unknown; retry?: RetryAdvice } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.param = options.param ?? null;
    this.retry = options.retry;
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
