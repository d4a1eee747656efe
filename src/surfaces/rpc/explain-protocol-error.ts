import { type DescMethod, fromBinary } from "@bufbuild/protobuf";
import { base64Decode } from "@bufbuild/protobuf/wire";
import { Code, type ConnectError } from "@connectrpc/connect";
import {
  ApiError,
  callerDeadlineExceeded,
  clip,
  invalidRequest,
  requestTooLarge,
  unsupportedEncoding,
} from "../../core/errors/index.js";
import { type BodyEncoding, inflateBounded } from "../../core/index.js";
import { explainProtoJson } from "./explain-proto-json.js";
import { compressedFlag, type Frame, type FrameFacts, splitFrames } from "./frame-reader.js";
import { isJsonContentType, type RpcErrorForm, rpcErrorForm } from "./protocol-error.js";

/** What is known of an RPC request that connect-es refused. */
export interface RefusedRequest {
  /** The RPC it was for. */
  readonly method: DescMethod;
  /** HTTP method (`POST`, `GET`). */
  readonly httpMethod: string;
  /** The request URL (Connect GET carries its message in the query). */
  readonly url: string;
  readonly header: Headers;
  /** The body as received, when it was kept; undefined otherwise (read only when needed). */
  readonly body: () => Uint8Array | undefined;
  /** What was counted of a framed body's frames as they passed, when its bytes were not kept. */
  readonly frames?: FrameFacts | undefined;
  /** The router's limit on a message, in bytes (before and after decompression). */
  readonly readMaxBytes: number;
  /**
   * The refusal our strict decoder carried in the error (src/surfaces/rpc/carried-refusal.ts), when it
   * refused the message; a fault of the body's framing still comes first.
   */
  readonly carried?: ApiError | undefined;
}

const grpcTimeoutUnitMs: Readonly<Record<string, number>> = {
  H: 3_600_000,
  M: 60_000,
  S: 1000,
  m: 1,
  u: 0.001,
  n: 0.000_001,
};

/** The timeout header of `form` and its value, if sent. */
function timeoutHeader(form: RpcErrorForm, header: Headers): { name: string; value: string } | undefined {
  const name = form === "grpc" || form === "grpc-web" ? "grpc-timeout" : "connect-timeout-ms";
  const value = header.get(name);
  return value === null ? undefined : { name, value };
}

/**
 * The deadline a caller set, in milliseconds: `Connect-Timeout-Ms: 800` (Connect) or
 * `grpc-timeout: 800m` (gRPC, gRPC-Web; units H, M, S, m, u, n). Undefined when none or malformed.
 */
export function callerTimeoutMs(contentType: string | null, header: Headers): number | undefined {
  const sent = timeoutHeader(rpcErrorForm(contentType), header);
  if (sent === undefined) return undefined;
  if (sent.name === "connect-timeout-ms")
    return /^\d{1,10}$/.test(sent.value) ? Number(sent.value) : undefined;
  const match = /^(\d{1,8})([HMSmun])$/.exec(sent.value);
  if (match === null) return undefined;
  return Number(match[1]) * (grpcTimeoutUnitMs[match[2] as string] ?? 1);
}

/** 400 for a timeout header that is not in its protocol's form, else undefined. */
function badTimeout(form: RpcErrorForm, header: Headers): ApiError | undefined {
  const sent = timeoutHeader(form, header);
  if (sent === undefined) return undefined;
  const ok =
    sent.name === "connect-timeout-ms" ? /^\d{1,10}$/.test(sent.value) : /^\d{1,8}[HMSmun]$/.test(sent.value);
  if (ok) return undefined;
  const form_ =
    sent.name === "connect-timeout-ms"
      ? "a whole number of milliseconds, at most 10 digits"
      : "at most 8 digits and a unit (H, M, S, m, u or n), e.g. 800m";
  return invalidRequest(null, `Invalid ${sent.name} header '${clip(sent.value)}': send ${form_}.`);
}

/** The compression a request names for its messages: header per protocol, query for Connect GET. */
function requestEncodingName(form: RpcErrorForm, req: RefusedRequest): string | undefined {
  if (form === "connect" && req.httpMethod === "GET") {
    return new URL(req.url).searchParams.get("compression") ?? undefined;
  }
  const name =
    form === "grpc" || form === "grpc-web"
      ? "grpc-encoding"
      : form === "connect-stream"
        ? "connect-content-encoding"
        : "content-encoding";
  return req.header.get(name) ?? undefined;
}

/** The coding of an RPC message (one exact name, as RPC protocols send it), or an ApiError 415. */
function messageCoding(name: string | undefined): BodyEncoding | undefined | ApiError {
  if (name === undefined || name === "identity") return undefined;
  if (name === "gzip" || name === "deflate" || name === "br") return name;
  return unsupportedEncoding(name);
}

function isJsonRequest(form: RpcErrorForm, req: RefusedRequest): boolean {
  if (form === "connect" && req.httpMethod === "GET") {
    return new URL(req.url).searchParams.get("encoding") === "json";
  }
  return isJsonContentType(req.header.get("content-type") ?? "");
}

/**
 * The fault of an enveloped body's frames, in the order they are looked at: cut short, no message,
 * several (every RPC here takes one), a compressed flag with no compression named.
 */
function framingFault(
  facts: FrameFacts,
  typeName: string,
  coding: BodyEncoding | undefined,
): ApiError | undefined {
  if (facts.incomplete) {
    return invalidRequest(
      null,
      "The request body ends inside a message frame: each message is a 5-byte header (flags, length) and as many bytes as the length says.",
    );
  }
  if (facts.count === 0) return invalidRequest(null, `The request has no message: send one ${typeName}.`);
  if (facts.count > 1) {
    return invalidRequest(null, `The request has ${facts.count} messages: send exactly one ${typeName}.`);
  }
  if (((facts.firstFlags ?? 0) & compressedFlag) !== 0 && coding === undefined) {
    return invalidRequest(
      null,
      "The message is flagged as compressed, but the request names no compression.",
    );
  }
  return undefined;
}

/** The message of an enveloped body held whole (compression undone), or the fault of its frames. */
async function frameMessage(
  bytes: Uint8Array,
  req: RefusedRequest,
  coding: BodyEncoding | undefined,
): Promise<Uint8Array | ApiError> {
  const frames = splitFrames(bytes);
  const facts =
    frames === "incomplete"
      ? { count: 0, firstFlags: undefined, incomplete: true }
      : { count: frames.length, firstFlags: frames[0]?.flags, incomplete: false };
  const fault = framingFault(facts, req.method.input.typeName, coding);
  if (fault !== undefined) return fault;
  const first = (frames as Frame[])[0] as Frame;
  if ((first.flags & compressedFlag) === 0 || coding === undefined) return first.data;
  return await inflateBounded(first.data, coding, req.readMaxBytes);
}

/** The request message's bytes as sent (framing and compression undone), or the fault found. */
async function messageBytes(
  form: RpcErrorForm,
  req: RefusedRequest,
  coding: BodyEncoding | undefined,
): Promise<Uint8Array | ApiError | undefined> {
  let bytes = req.body();
  if (form === "connect" && req.httpMethod === "GET") {
    const query = new URL(req.url).searchParams;
    const message = query.get("message") ?? "";
    try {
      bytes = query.get("base64") === "1" ? base64Decode(message) : new TextEncoder().encode(message);
    } catch {
      return invalidRequest(null, "The 'message' query parameter is not valid base64.");
    }
  }
  if (bytes === undefined) {
    // Not kept: a framed body's frames were counted as they passed (its message is not known).
    const counted = form === "connect" ? undefined : req.frames;
    return counted === undefined ? undefined : framingFault(counted, req.method.input.typeName, coding);
  }
  try {
    if (form === "connect")
      return coding === undefined ? bytes : await inflateBounded(bytes, coding, req.readMaxBytes);
    return await frameMessage(bytes, req, coding);
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
}

/** Why the request's message cannot be read (framing, compression, protobuf or JSON), if it cannot. */
async function explainBody(
  form: RpcErrorForm,
  req: RefusedRequest,
  coding: BodyEncoding | undefined,
): Promise<ApiError | undefined> {
  const message = await messageBytes(form, req, coding);
  if (message === undefined || message instanceof ApiError) return message;
  const schema = req.method.input;
  if (isJsonRequest(form, req)) return explainProtoJson(schema, message);
  try {
    fromBinary(schema, message);
    return undefined;
  } catch (err) {
    const detail = err instanceof Error ? err.message : String(err);
    return invalidRequest(
      null,
      `The request body is not a valid protobuf encoding of ${schema.typeName}: ${clip(detail)}.`,
    );
  }
}

/**
 * The API's error for an RPC request that connect-es refused on its own (before or around our
 * handler), decided from what the request was rather than from connect-es's wording:
 * - DeadlineExceeded → 504 `deadline_exceeded` (the caller's deadline); Canceled → `canceled`;
 *   ResourceExhausted → 413 `request_too_large` (connect-es's read limit, before or after
 *   decompression);
 * - a compression other than identity, gzip, deflate, br → 415 `unsupported_media_type`;
 * - a malformed timeout header → 400;
 * - a body that cannot be read → 400 `invalid_request`: cut-short frames, no or several messages,
 *   corrupt compression (413 for a bomb), bytes that are not protobuf (protobuf-es's reason), or
 *   JSON that is not the message — in the REST decoder's words, with the field as `param`: the
 *   refusal the strict decoder carried (`req.carried`), else read again from the body kept;
 * - else 400 with connect-es's own message for InvalidArgument/Unimplemented, 500 otherwise.
 */
export async function explainProtocolError(err: ConnectError, req: RefusedRequest): Promise<ApiError> {
  const contentType = req.header.get("content-type");
  const form = rpcErrorForm(contentType);
  switch (err.code) {
    case Code.DeadlineExceeded:
      return callerDeadlineExceeded(callerTimeoutMs(contentType, req.header));
    case Code.Canceled:
      return new ApiError("canceled", "The client canceled the call.", { cause: err });
    case Code.ResourceExhausted:
      return requestTooLarge(req.readMaxBytes, err);
  }
  const coding = messageCoding(requestEncodingName(form, req));
  if (coding instanceof ApiError) return coding;
  const timeout = badTimeout(form, req.header);
  if (timeout !== undefined) return timeout;
  if (req.carried !== undefined) {
    const framing = await messageBytes(form, req, coding);
    return framing instanceof ApiError ? framing : req.carried;
  }
  // A JSON message refused with our ApiError as the cause (a handler's own throw): the same words.
  if (isJsonRequest(form, req) && err.cause instanceof ApiError) return err.cause;
  const fault = await explainBody(form, req, coding);
  if (fault !== undefined) return fault;
  if (err.code === Code.InvalidArgument || err.code === Code.Unimplemented) {
    return invalidRequest(null, `The request was refused: ${clip(err.rawMessage)}.`);
  }
  return new ApiError("internal_error", "The server had an error while processing your request.", {
    cause: err,
  });
}
