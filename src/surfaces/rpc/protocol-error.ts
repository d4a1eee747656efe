import type { ServerResponse } from "node:http";
import type { Http2ServerResponse } from "node:http2";
import type { ConnectError } from "@connectrpc/connect";
import {
  createAsyncIterable,
  encodeEnvelope,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import { endStreamFlag, endStreamToJson, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";

/**
 * How an RPC request wants its error, from its Content-Type:
 * - `grpc`: `application/grpc…` — HTTP 200, `grpc-status`, `grpc-message` and
 *   `grpc-status-details-bin` in the trailers;
 * - `grpc-web`: `application/grpc-web…` — HTTP 200, the same fields in a trailer frame of the body;
 * - `connect-stream`: `application/connect+…` — HTTP 200, an end-of-stream frame holding the
 *   Connect error JSON;
 * - `connect`: anything else (Connect unary `application/json` / `application/proto`, or a type
 *   no protocol serves) — the Connect error JSON (`{code, message, details}`) as the body, with an
 *   HTTP error status.
 */
export type RpcErrorForm = "connect" | "connect-stream" | "grpc" | "grpc-web";

/** The error form of a request with this Content-Type (see {@link RpcErrorForm}). */
export function rpcErrorForm(contentType: string | null | undefined): RpcErrorForm {
  const type = (contentType ?? "").trim().toLowerCase();
  if (type.startsWith("application/grpc-web")) return "grpc-web";
  if (type.startsWith("application/grpc")) return "grpc";
  if (type.startsWith("application/connect+")) return "connect-stream";
  return "connect";
}

/** True for `+json` (and Connect unary `application/json`) request types, in any case. */
export function isJsonContentType(type: string): boolean {
  return /^application\/(?:json|(?:grpc|grpc-web|connect)\+json)\b/i.test(type);
}

/** The response Content-Type of an error in `form`, the request's own when it is a known one. */
function responseContentType(form: RpcErrorForm, contentType: string | null | undefined): string {
  const type = (contentType ?? "").trim().toLowerCase();
  const json = isJsonContentType(type);
  switch (form) {
    case "grpc":
      return json ? "application/grpc+json" : "application/grpc+proto";
    case "grpc-web":
      return json ? "application/grpc-web+json" : "application/grpc-web+proto";
    case "connect-stream":
      return json ? "application/connect+json" : "application/connect+proto";
    case "connect":
      return "application/json";
  }
}

/** An RPC error response, ready to write: status, headers, body bytes, trailers (gRPC only). */
interface ErrorParts {
  readonly status: number;
  readonly header: Headers;
  readonly body: Uint8Array;
  readonly trailer?: Headers;
}

function errorParts(
  contentType: string | null | undefined,
  error: ConnectError,
  httpStatus: number,
): ErrorParts {
  const form = rpcErrorForm(contentType);
  const header = new Headers({ "content-type": responseContentType(form, contentType) });
  switch (form) {
    case "grpc":
      return {
        status: 200,
        header,
        body: new Uint8Array(0),
        trailer: setTrailerStatus(new Headers(), error),
      };
    case "grpc-web": {
      const trailer = trailerSerialize(setTrailerStatus(new Headers(), error));
      return { status: 200, header, body: encodeEnvelope(trailerFlag, trailer) };
    }
    case "connect-stream": {
      const json = JSON.stringify(endStreamToJson(error.metadata, error, {}));
      return { status: 200, header, body: encodeEnvelope(endStreamFlag, new TextEncoder().encode(json)) };
    }
    case "connect": {
      error.metadata.forEach((value, key) => {
        header.set(key, value);
      });
      const body = errorToJsonBytes(error, {});
      header.set("content-length", String(body.byteLength));
      return { status: httpStatus, header, body };
    }
  }
}

/**
 * `error` in the error form of a request with `contentType`, as a connect-es universal response:
 * Connect unary answers `httpStatus` with the Connect error JSON (and the error's metadata as
 * headers); the streaming protocols answer 200 and carry the error (and its metadata) at their end
 * of stream — gRPC in trailers, gRPC-Web in a trailer frame, Connect streaming in an end-stream
 * frame. Details (our acs.v1.ErrorEnvelope) travel as each protocol carries them.
 */
export function protocolErrorResponse(
  contentType: string | null | undefined,
  error: ConnectError,
  httpStatus: number,
): UniversalServerResponse {
  const parts = errorParts(contentType, error, httpStatus);
  return {
    status: parts.status,
    header: parts.header,
    body: createAsyncIterable(parts.body.byteLength === 0 ? [] : [parts.body]),
    ...(parts.trailer === undefined ? {} : { trailer: parts.trailer }),
  };
}

function toRecord(headers: Headers | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  headers?.forEach((value, key) => {
    out[key] = value;
  });
  return out;
}

/**
 * Answers a Connect, gRPC or gRPC-Web request with `error` in that protocol's own error form (see
 * {@link protocolErrorResponse}) on a raw Node response, without running a handler: for refusals
 * made before connect-node sees the request (a body over the size limit, an unknown method, a
 * Content-Type no handler takes). gRPC gets a trailers-only response (the status in the headers,
 * no body), as gRPC servers answer a call they refuse at once. Uses connect-es's protocol helpers
 * (pinned version; they are marked internal).
 */
export function writeProtocolError(
  contentType: string | undefined,
  error: ConnectError,
  httpStatus: number,
  res: ServerResponse | Http2ServerResponse,
): void {
  const parts = errorParts(contentType, error, httpStatus);
  if (parts.trailer !== undefined && "stream" in res) {
    // gRPC over HTTP/2: trailers-only, the status in one HEADERS frame that ends the stream (a
    // HEADERS frame without END_STREAM holding grpc-status is read by gRPC C-core as headers only).
    res.stream.respond(
      { ...res.getHeaders(), ":status": parts.status, ...toRecord(parts.header), ...toRecord(parts.trailer) },
      { endStream: true },
    );
    return;
  }
  res.writeHead(parts.status, { ...toRecord(parts.header), ...toRecord(parts.trailer) });
  res.end(parts.body);
}
