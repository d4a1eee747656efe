import { Code, ConnectError, type ConnectRouter, createContextValues } from "@connectrpc/connect";
import {
  createAsyncIterable,
  encodeEnvelope,
  type UniversalHandler,
  type UniversalServerRequest,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import {
  endStreamFlag,
  endStreamFromJson,
  endStreamToJson,
  errorFromJsonBytes,
} from "@connectrpc/connect/protocol-connect";
import { findTrailerError, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";
import { ErrorEnvelopeSchema } from "../../../gen/acs/v1/error_pb.js";
import { type ApiError, type ErrorCode, errorCatalogue, newRequestId } from "../../core/errors/index.js";
import { asHandlerOf, decodeContentEncoding } from "../../core/index.js";
import { carriedRefusal, hasFinalEnvelope } from "./carried-refusal.js";
import { earlyRefusal } from "./early-refusal.js";
import { toConnectError } from "./error-conversion.js";
import { explainProtocolError } from "./explain-protocol-error.js";
import { compressedFlag, type FrameTally, frameHeaderBytes } from "./frame-reader.js";
import { protocolErrorResponse, rpcErrorForm } from "./protocol-error.js";
import { type BodyCapture, explainsRequest, observeRequestBody } from "./request-body.js";
import { fixLastFrame, thenAtEnd } from "./response-frames.js";
import { requestIdKey } from "./routes.js";

/** Options of {@link withErrorEnvelopes}. */
export interface ErrorEnvelopeOptions {
  /** The router's `readMaxBytes`: limit of a message in bytes. */
  readonly readMaxBytes: number;
  /** Called for every refusal that becomes a 500 (connect-es failed on its own). */
  readonly onInternalError?: (err: unknown, requestId: string) => void;
}

/** Most bytes an error body or last frame may inflate to, when the response is compressed. */
const MAX_ERROR_BYTES = 16 * 1024 * 1024;

/** One call through the envelopes: the request as connect-es gets it, and what explains its errors. */
interface EnvelopeCall {
  readonly handler: UniversalHandler;
  readonly opts: ErrorEnvelopeOptions;
  readonly req: UniversalServerRequest;
  readonly requestId: string;
  readonly contentType: string | null;
  /** The body kept to explain a refusal, if it is kept (src/surfaces/rpc/request-body.ts). */
  readonly capture: BodyCapture | undefined;
  /** The frames counted of a framed body not kept, if they are counted. */
  readonly tally: FrameTally | undefined;
}

function startCall(
  handler: UniversalHandler,
  opts: ErrorEnvelopeOptions,
  request: UniversalServerRequest,
): EnvelopeCall {
  const contextValues = request.contextValues ?? createContextValues();
  const requestId = contextValues.get(requestIdKey) ?? newRequestId();
  const limit = opts.readMaxBytes + frameHeaderBytes;
  const { req, capture, tally } = observeRequestBody(handler, request, contextValues, limit, requestId);
  return { handler, opts, req, requestId, contentType: req.header.get("content-type"), capture, tally };
}

function envelopeCode(err: ConnectError): ErrorCode | undefined {
  const code = err.findDetails(ErrorEnvelopeSchema)[0]?.error?.code;
  return code !== undefined && code in errorCatalogue ? (code as ErrorCode) : undefined;
}

/**
 * False when a Connect end-stream message (JSON, as connect-es writes it) surely has no `error`
 * member: no `error` in its bytes, and no escape that could spell one. A complete stream's
 * end-stream message (`{}`, or its trailers as `metadata`) is then passed on unparsed.
 */
function mayHoldError(json: Uint8Array): boolean {
  const bytes = Buffer.from(json.buffer, json.byteOffset, json.byteLength);
  return bytes.includes("error") || bytes.includes(0x5c);
}

/** `api` as a ConnectError with the envelope, keeping the metadata of the error it replaces. */
function replacement(api: ApiError, requestId: string, replaced: ConnectError | undefined): ConnectError {
  const err = toConnectError(api, requestId);
  replaced?.metadata.forEach((value, key) => {
    if (!err.metadata.has(key)) err.metadata.set(key, value);
  });
  return err;
}

/** The refusal our strict decoder carried in `err`, for a method whose refusals are explained. */
function carriedBy(call: EnvelopeCall, err: ConnectError): ApiError | undefined {
  // Where the body's bytes (or frames) are no longer known, the refusal is not explained from them.
  const lost = call.capture?.kept === false || call.tally?.known === false;
  if (!explainsRequest(call.handler) || lost) return undefined;
  return carriedRefusal(err);
}

/** The envelope error that replaces a bare one connect-es raised (or one our decoder carried). */
async function explain(call: EnvelopeCall, err: ConnectError): Promise<ConnectError> {
  const { handler, req, opts } = call;
  const api = await explainProtocolError(err, {
    method: handler.method,
    httpMethod: req.method,
    url: req.url,
    header: req.header,
    body: () => call.capture?.bytes(),
    frames: call.tally?.known === true ? call.tally : undefined,
    readMaxBytes: opts.readMaxBytes,
    carried: carriedBy(call, err),
  });
  call.capture?.release();
  if (api.code === "internal_error") opts.onInternalError?.(err, call.requestId);
  return replacement(api, call.requestId, err);
}

async function readAll(body: AsyncIterable<Uint8Array> | undefined): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  if (body !== undefined) for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** `data` inflated when its frame's `flags` say compressed and the response names `encoding`. */
async function framePayload(flags: number, data: Uint8Array, encoding: string | null): Promise<Uint8Array> {
  return (flags & compressedFlag) === 0 || encoding === null
    ? data
    : await decodeContentEncoding(data, encoding, MAX_ERROR_BYTES);
}

/** An early refusal of connect-es (no body), answered with the envelope. */
function answerEarlyRefusal(call: EnvelopeCall, res: UniversalServerResponse): UniversalServerResponse {
  call.capture?.release();
  const api = earlyRefusal(res.status, call.handler, call.req);
  const out = protocolErrorResponse(call.contentType, toConnectError(api, call.requestId), api.status);
  if (api.code === "method_not_allowed" && res.status === 405) {
    out.header?.set("allow", call.handler.allowedMethods.join(", "));
  }
  return out;
}

/** Connect unary: an error body without a final envelope is replaced, with the catalogue's status. */
async function fixConnectUnary(
  call: EnvelopeCall,
  res: UniversalServerResponse,
): Promise<UniversalServerResponse> {
  if (res.status === 200) return res;
  const raw = await readAll(res.body);
  const header = new Headers(res.header);
  const encoding = header.get("content-encoding");
  const json = encoding === null ? raw : await decodeContentEncoding(raw, encoding, MAX_ERROR_BYTES);
  const parsed = errorFromJsonBytes(
    json,
    undefined,
    new ConnectError("the error body is not a Connect error", Code.Internal),
  );
  if (hasFinalEnvelope(parsed)) {
    const code = envelopeCode(parsed);
    const status = code === undefined ? res.status : errorCatalogue[code].status;
    return { ...res, status, body: createAsyncIterable([raw]) };
  }
  const err = await explain(call, parsed);
  const out = protocolErrorResponse(
    call.contentType,
    err,
    errorCatalogue[envelopeCode(err) ?? "internal_error"].status,
  );
  for (const name of ["content-type", "content-length", "content-encoding"]) header.delete(name);
  out.header?.forEach((value, key) => {
    header.set(key, value);
  });
  return { ...out, header };
}

/** Connect streaming: an end-stream message with an error but no final envelope is replaced. */
function fixConnectStream(call: EnvelopeCall, res: UniversalServerResponse): UniversalServerResponse {
  if (res.body === undefined) return res;
  const encoding = new Headers(res.header).get("connect-content-encoding");
  const fixed = fixLastFrame(
    res.body,
    (flags) => (flags & endStreamFlag) === endStreamFlag,
    async (flags, data) => {
      const compressed = (flags & compressedFlag) !== 0 && encoding !== null;
      if (!compressed && !mayHoldError(data)) return undefined;
      const end = endStreamFromJson(await framePayload(flags, data, encoding));
      if (end.error === undefined || hasFinalEnvelope(end.error)) return undefined;
      const err = await explain(call, end.error);
      const text = JSON.stringify(endStreamToJson(end.metadata, err, {}));
      return encodeEnvelope(endStreamFlag, new TextEncoder().encode(text));
    },
  );
  return { ...res, body: fixed };
}

/** gRPC-Web: a trailer frame with an error but no final envelope is replaced. */
function fixGrpcWeb(call: EnvelopeCall, res: UniversalServerResponse): UniversalServerResponse {
  if (res.body === undefined) return res;
  const encoding = new Headers(res.header).get("grpc-encoding");
  const fixed = fixLastFrame(
    res.body,
    (flags) => (flags & trailerFlag) === trailerFlag,
    async (flags, data) => {
      const trailer = trailerParse(await framePayload(flags, data, encoding));
      const bare = findTrailerError(trailer);
      if (bare === undefined || hasFinalEnvelope(bare)) return undefined;
      const err = await explain(call, bare);
      return encodeEnvelope(trailerFlag, trailerSerialize(setTrailerStatus(trailer, err)));
    },
  );
  return { ...res, body: fixed };
}

/** gRPC: trailers with an error but no final envelope get it, once the body has ended. */
function fixGrpc(call: EnvelopeCall, res: UniversalServerResponse): UniversalServerResponse {
  const trailer = res.trailer;
  if (res.body === undefined || trailer === undefined) return res;
  const fixed = thenAtEnd(res.body, async () => {
    const bare = findTrailerError(trailer);
    if (bare !== undefined && !hasFinalEnvelope(bare)) setTrailerStatus(trailer, await explain(call, bare));
  });
  return { ...res, body: fixed };
}

/** Runs the call's handler and rewrites a bare error in its protocol's own form. */
async function withEnvelopes(call: EnvelopeCall): Promise<UniversalServerResponse> {
  let res: UniversalServerResponse;
  try {
    res = await call.handler(call.req);
  } catch (err) {
    const cause = ConnectError.from(err, Code.Internal);
    return protocolErrorResponse(call.contentType, await explain(call, cause), 500);
  }
  if (res.body === undefined && res.status >= 400) return answerEarlyRefusal(call, res);
  switch (rpcErrorForm(call.contentType)) {
    case "connect":
      return fixConnectUnary(call, res);
    case "connect-stream":
      return fixConnectStream(call, res);
    case "grpc-web":
      return fixGrpcWeb(call, res);
    case "grpc":
      return fixGrpc(call, res);
  }
}

function wrap(handler: UniversalHandler, opts: ErrorEnvelopeOptions): UniversalHandler {
  return asHandlerOf(handler, (request: UniversalServerRequest) =>
    withEnvelopes(startCall(handler, opts, request)),
  );
}

/**
 * Wraps `routes` so that every error of every RPC carries the acs.v1.ErrorEnvelope detail, also
 * when connect-es raises it itself, before or around our handlers: a body it cannot parse (binary
 * or JSON, in the REST decoder's words and with the field as `param`), an unknown field, an
 * unsupported compression or Content-Type, a method it does not take (Connect GET of a method with
 * side effects), a message over `readMaxBytes` (no Content-Length needed), a caller's deadline.
 * Each registered universal handler is replaced by one that runs it and rewrites a bare error in
 * its protocol's own form (Connect JSON body, Connect end-stream frame, gRPC trailers, gRPC-Web
 * trailer frame); errors that already carry the envelope pass unchanged, and a refusal our strict
 * JSON decoder carried (src/surfaces/rpc/carried-refusal.ts) is given the call's request id. Connect
 * unary errors answer with the catalogue's HTTP status (REST's), not connect-es's code→status table.
 *
 * Needs {@link releaseParsedBody} among the router's interceptors and the request id under
 * `requestIdKey` in the context values.
 */
export function withErrorEnvelopes(
  routes: (router: ConnectRouter) => void,
  opts: ErrorEnvelopeOptions,
): (router: ConnectRouter) => void {
  return (router) => {
    routes(router);
    const wrapped = router.handlers.map((h) => wrap(h, opts));
    router.handlers.splice(0, router.handlers.length, ...wrapped);
  };
}
