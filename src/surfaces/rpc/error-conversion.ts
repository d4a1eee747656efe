import { create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { ErrorEnvelopeSchema, ErrorSchema } from "../../../gen/acs/v1/error_pb.js";
import { errorCatalogue, retryHeaders, toApiError } from "../../core/errors/index.js";

/**
 * Any error as a ConnectError carrying the acs.v1.ErrorEnvelope detail (same message, type, code,
 * param and request id as the REST envelope), with the Connect code of the catalogue. A 429's
 * retry advice (`x-should-retry`, `retry-after`) is the error's metadata: Connect unary sends it
 * as response headers, the streaming protocols in their trailers / end of stream.
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
    retryHeaders(api.retry),
    [{ desc: ErrorEnvelopeSchema, value: envelope }],
    api,
  );
}
