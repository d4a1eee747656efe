import type { FastifyReply, FastifyRequest } from "fastify";
import { limits } from "../../config/index.js";
import {
  ApiError,
  type ErrorCode,
  isRequestId,
  newRequestId,
  requestTooLarge,
  retryHeaders,
  toApiError,
} from "../../core/errors/index.js";
import { isAcceptedRequestId } from "../../telemetry/request-id.js";

const REQUEST_ID_HEADER = "x-request-id";

export { requestTooLarge };

/**
 * The request id of this exchange, the one function that names it: the `X-Request-Id` response
 * header when one is already set (the server's root hook sets fastify's `request.id`), else the
 * request's fastify id when the server made it (`req_` + 32 hex, or the caller's valid
 * X-Request-Id: src/telemetry/request-id.ts), else a fresh `req_` + 32 hex; set as the
 * header. Calling it again returns the same id, so every response — errors included — carries the
 * id of its envelope.
 */
export function requestIdOf(reply: FastifyReply): string {
  const existing = reply.getHeader(REQUEST_ID_HEADER);
  if (typeof existing === "string" && isAcceptedRequestId(existing)) return existing;
  // fastify's id when the server made it: ours (req_ + 32 hex), or the caller's X-Request-Id kept.
  const { id: given, headers } = reply.request;
  const id =
    isRequestId(given) || (given === headers["x-request-id"] && isAcceptedRequestId(given))
      ? given
      : newRequestId();
  reply.header(REQUEST_ID_HEADER, id);
  return id;
}

/** fastify's own error codes (content-type parser, body), as the API's errors. */
const fastifyErrors: Readonly<Record<string, { code: ErrorCode; message: string }>> = {
  FST_ERR_CTP_INVALID_MEDIA_TYPE: {
    code: "unsupported_media_type",
    message: "Unsupported Content-Type: send the request body as JSON with 'Content-Type: application/json'.",
  },
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: {
    code: "invalid_request",
    message: "The request body's length does not match its Content-Length header.",
  },
  FST_ERR_CTP_EMPTY_JSON_BODY: {
    code: "invalid_request",
    message: "The request body is empty: send a JSON object.",
  },
  FST_ERR_CTP_INVALID_JSON_BODY: { code: "invalid_request", message: "The request body is not valid JSON." },
};

/** HTTP statuses of other fastify errors (err.statusCode) → the catalogue's code. */
const statusCodes: Readonly<Record<number, ErrorCode>> = {
  400: "invalid_request",
  404: "unknown_route",
  405: "method_not_allowed",
  413: "request_too_large",
  415: "unsupported_media_type",
};

/**
 * Any thrown value as an ApiError: ApiErrors pass through; fastify's body and content-type errors
 * (`FST_ERR_CTP_*`) and its other 4xx errors map onto the catalogue; anything else is 500
 * `internal_error` (its message is never shown).
 */
export function apiErrorFrom(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (typeof err === "object" && err !== null) {
    const { code, statusCode, message } = err as { code?: unknown; statusCode?: unknown; message?: unknown };
    if (code === "FST_ERR_CTP_BODY_TOO_LARGE") {
      const tooLarge = requestTooLarge(limits.bodyLimitBytes);
      return new ApiError(tooLarge.code, tooLarge.message, { cause: err });
    }
    const known = typeof code === "string" ? fastifyErrors[code] : undefined;
    if (known !== undefined) return new ApiError(known.code, known.message, { cause: err });
    const mapped = typeof statusCode === "number" ? statusCodes[statusCode] : undefined;
    if (mapped !== undefined && typeof message === "string")
      return new ApiError(mapped, message, { cause: err });
  }
  return toApiError(err);
}

/**
 * Sends `err` as the error envelope of proto/API.md §7 (`{error: {message, type, param, code},
 * request_id}`, all four keys always present) with its catalogue status, the `X-Request-Id`
 * header, `Content-Type: application/json`, and the retry advice of a 429 (`x-should-retry`,
 * `Retry-After`; see retryHeaders). Does nothing when the response has already
 * started (the caller then has to end the stream its own way).
 */
export function sendError(reply: FastifyReply, err: unknown, requestId: string): FastifyReply {
  if (reply.sent || reply.raw.headersSent) return reply;
  const apiError = apiErrorFrom(err);
  // A bug is an error; Inference's failures and the deadline are warnings (the access log has the rest).
  if (apiError.code === "internal_error")
    reply.log.error({ err: apiError.cause ?? apiError }, apiError.message);
  else if (apiError.status >= 500) reply.log.warn({ err: apiError.cause ?? apiError }, apiError.message);
  for (const [name, value] of Object.entries(retryHeaders(apiError.retry))) reply.header(name, value);
  return reply
    .code(apiError.status)
    .header(REQUEST_ID_HEADER, requestId)
    .type("application/json; charset=utf-8")
    .send(JSON.stringify(apiError.toEnvelope(requestId)));
}

function pathOf(request: FastifyRequest): string {
  const url = request.raw.url ?? request.url;
  const query = url.indexOf("?");
  return query === -1 ? url : url.slice(0, query);
}

/**
 * 404 `unknown_route` for a route (or RPC method) the API does not have, in OpenAI's wording:
 * `Invalid URL (POST /v1/foo)`, `Invalid URL (POST /acs.v1.CompletionsService/Nope)`.
 */
export function unknownRoute(request: FastifyRequest): ApiError {
  return new ApiError("unknown_route", `Invalid URL (${request.method} ${pathOf(request)})`);
}

/**
 * 404 `unknown_route` for a route the API does not have (see {@link unknownRoute}), with
 * `X-Request-Id`. Usable as a fastify not-found handler.
 */
export function renderNotFound(request: FastifyRequest, reply: FastifyReply): FastifyReply {
  return sendError(reply, unknownRoute(request), requestIdOf(reply));
}

/**
 * 405 `method_not_allowed` for a known route called with another method, with an `Allow` header
 * listing `allowed` (e.g. `["POST"]`) and `X-Request-Id`.
 */
export function renderMethodNotAllowed(
  request: FastifyRequest,
  reply: FastifyReply,
  allowed: readonly string[],
): FastifyReply {
  const error = new ApiError(
    "method_not_allowed",
    `Method ${request.method} is not allowed on ${pathOf(request)}; use ${allowed.join(" or ")}.`,
  );
  reply.header("allow", allowed.join(", "));
  return sendError(reply, error, requestIdOf(reply));
}
