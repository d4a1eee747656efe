import { Code } from "@connectrpc/connect";

/** OpenAI's error `type` values used by the API (proto/API.md §7). */
export type ErrorType = "invalid_request_error" | "insufficient_quota" | "rate_limit_error" | "server_error";

/** One entry of the closed catalogue: HTTP status, OpenAI type and Connect code of an error code. */
export interface ErrorKind {
  /** HTTP status on REST. */
  readonly status: number;
  readonly type: ErrorType;
  /** Connect/gRPC code; chosen explicitly (Connect's own HTTP→code table reads 400 as Internal). */
  readonly connectCode: Code;
}

/**
 * The closed catalogue of error codes (proto/API.md §7). Every ApiError carries one of these codes;
 * the status, type and Connect code come from here and nowhere else.
 *
 * One choice differs from the contract's table: `unknown_route` is Connect/gRPC `unimplemented`
 * (not `not_found`). gRPC defines UNIMPLEMENTED as "method not found on the server", and gRPC
 * clients act on it (reflection clients fall back from v1 to v1alpha on it); the Connect protocol
 * pairs `unimplemented` with HTTP 404. `unknown_route` only reaches the RPC surfaces as an unknown
 * method; REST still answers it 404.
 */
export const errorCatalogue = {
  invalid_request: { status: 400, type: "invalid_request_error", connectCode: Code.InvalidArgument },
  deadline_infeasible: { status: 400, type: "invalid_request_error", connectCode: Code.InvalidArgument },
  context_length_exceeded: { status: 400, type: "invalid_request_error", connectCode: Code.InvalidArgument },
  invalid_api_key: { status: 401, type: "invalid_request_error", connectCode: Code.Unauthenticated },
  model_not_allowed: { status: 403, type: "invalid_request_error", connectCode: Code.PermissionDenied },
  /** A key of the wrong kind: an API key on an admin route, an admin key on a completion route. */
  permission_denied: { status: 403, type: "invalid_request_error", connectCode: Code.PermissionDenied },
  model_not_found: { status: 404, type: "invalid_request_error", connectCode: Code.NotFound },
  /** The admin API: no API key with that id. */
  key_not_found: { status: 404, type: "invalid_request_error", connectCode: Code.NotFound },
  /** Connect/gRPC: `unimplemented`, gRPC's code for an unknown method (see above). */
  unknown_route: { status: 404, type: "invalid_request_error", connectCode: Code.Unimplemented },
  /** grpc.health.v1.Health/Check for a service the server does not serve (the protocol's NOT_FOUND). */
  unknown_service: { status: 404, type: "invalid_request_error", connectCode: Code.NotFound },
  method_not_allowed: { status: 405, type: "invalid_request_error", connectCode: Code.Unimplemented },
  request_too_large: { status: 413, type: "invalid_request_error", connectCode: Code.ResourceExhausted },
  unsupported_media_type: { status: 415, type: "invalid_request_error", connectCode: Code.InvalidArgument },
  insufficient_quota: { status: 429, type: "insufficient_quota", connectCode: Code.ResourceExhausted },
  rate_limited: { status: 429, type: "rate_limit_error", connectCode: Code.ResourceExhausted },
  internal_error: { status: 500, type: "server_error", connectCode: Code.Internal },
  upstream_error: { status: 502, type: "server_error", connectCode: Code.Unavailable },
  upstream_unavailable: { status: 503, type: "server_error", connectCode: Code.Unavailable },
  deadline_exceeded: { status: 504, type: "server_error", connectCode: Code.DeadlineExceeded },
  /** The caller went away. Never rendered to anyone; Connect's `canceled`, nginx's 499. */
  canceled: { status: 499, type: "server_error", connectCode: Code.Canceled },
} as const satisfies Record<string, ErrorKind>;

/** An error code of the catalogue. */
export type ErrorCode = keyof typeof errorCatalogue;
