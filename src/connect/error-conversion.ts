import { create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { ErrorEnvelopeSchema, ErrorSchema } from "../../gen/acs/v1/error_pb.js";
import { errorCatalogue, toApiError } from "../errors/index.js";

/**
 * Any error as a ConnectError carrying the acs.v1.ErrorEnvelope detail (same message, type, code,
 * param and request id as the REST envelope), with the Connect code of the catalogue, and a
 * `retry-after` metadata entry (seconds) when the error has one (429 `rate_limited`).
 */
export function toConnectError(err: unknown, requestId: string): ConnectError {
  const api = toApiError(err);
  const envelope = create(ErrorEnvelopeSchema, {
    error: create(ErrorSchema, {
      message: api.message,
      type: api.type,
      ...(api.param === null ? {} : { param: api.param }),
      code: api.code,
    }),
    requestId,
  });
  return new ConnectError(
    api.message,
    errorCatalogue[api.code].connectCode,
    // X-Request-Id is already a response header (set before the handler runs).
    api.retryAfterSeconds === undefined ? undefined : { "retry-after": String(api.retryAfterSeconds) },
    [{ desc: ErrorEnvelopeSchema, value: envelope }],
    api,
  );
}
