// A refusal of our strict JSON decoder (src/surfaces/rpc/strict-json-text.ts), carried to the error
// envelopes (src/surfaces/rpc/error-envelopes.ts) through connect-es's own error: the decoder runs
// inside connect-es, which knows no request id and keeps no `cause` when it writes the error
// (test/surfaces/rpc/connect-es-behaviours.test.ts), so the decoder throws a ConnectError that holds the
// acs.v1.ErrorEnvelope with no request id yet; connect-es passes a ConnectError through as it is,
// on every protocol, and the envelopes give it the call's id. The body is not read again.
import type { ConnectError } from "@connectrpc/connect";
import { ErrorEnvelopeSchema } from "../../../gen/acs/v1/error_pb.js";
import { ApiError, type ErrorCode, errorCatalogue } from "../../core/errors/index.js";
import { toConnectError } from "./error-conversion.js";

/** `api` as the error a decoder inside connect-es throws: its envelope, with no request id. */
export function carryRefusal(api: ApiError): ConnectError {
  return toConnectError(api, "");
}

/**
 * The ApiError {@link carryRefusal} put in `err` (as connect-es wrote it: Connect error JSON, end
 * stream, gRPC status details), or undefined when `err` carries none. Code, message and param are
 * the decoder's; the OpenAI type follows from the code.
 */
export function carriedRefusal(err: ConnectError): ApiError | undefined {
  const envelope = err.findDetails(ErrorEnvelopeSchema)[0];
  if (envelope === undefined || envelope.requestId !== "" || envelope.error === undefined) return undefined;
  const { code, message, param } = envelope.error;
  if (code === undefined || !(code in errorCatalogue)) return undefined;
  return new ApiError(code as ErrorCode, message, { param: param ?? null });
}

/**
 * True when `err` holds an envelope that is final (it names its request): it passes the
 * envelopes unchanged. A carried refusal is not final.
 */
export function hasFinalEnvelope(err: ConnectError): boolean {
  return err.findDetails(ErrorEnvelopeSchema).some((envelope) => envelope.requestId !== "");
}
