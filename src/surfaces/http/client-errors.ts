// Errors raised before any route or hook runs, in the error envelope of proto/API.md §7: an
// HTTP/1.1 request Node could not parse, and a URL fastify could not route. Shared by the main
// server and the ops port (src/surfaces/http/ops-server.ts).
import { STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import type { FastifyReply, FastifyRequest } from "fastify";
import { ApiError, invalidRequest, newRequestId } from "../../core/errors/index.js";
import { requestIdFrom } from "../../telemetry/request-id.js";
import { sendError } from "../rest/send-error.js";

/**
 * Answers an HTTP/1.1 connection Node could not parse (fastify's `clientErrorHandler`; the one-port
 * server calls it once the responses to the requests before the error are written), then closes
 * it: 400 `invalid_request` (413 `request_too_large` for chunk extensions over Node's limit) with
 * the envelope and `X-Request-Id`; a request past its deadline (408) or with headers over Node's
 * limit (431) as Node answers them, without a body (the error catalogue has no code for these).
 */
export function answerClientError(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === "ECONNRESET" || socket.destroyed) return;
  let head: string;
  if (err.code === "ERR_HTTP_REQUEST_TIMEOUT")
    head = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n";
  else if (err.code === "HPE_HEADER_OVERFLOW")
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n";
  else {
    const id = newRequestId();
    const reason = err.message.replace(/^Parse Error: /, "");
    const error =
      err.code === "HPE_CHUNK_EXTENSIONS_OVERFLOW"
        ? new ApiError("request_too_large", `Malformed HTTP/1.1 request: ${reason}`)
        : invalidRequest(null, `Malformed HTTP/1.1 request: ${reason}`);
    const body = JSON.stringify(error.toEnvelope(id));
    head =
      `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\n` +
      "Content-Type: application/json; charset=utf-8\r\n" +
      `Content-Length: ${Buffer.byteLength(body)}\r\nX-Request-Id: ${id}\r\nConnection: close\r\n\r\n${body}`;
  }
  if (socket.writable) socket.write(head);
  socket.destroy();
}

/**
 * fastify's `frameworkErrors`: an error fastify raises before routing (a malformed URL such as
 * /v1/models/%zz) as 400 `invalid_request` with the envelope and `X-Request-Id` (the hooks, which
 * set it otherwise, do not run).
 */
export function answerFrameworkError(error: Error, request: FastifyRequest, reply: FastifyReply): void {
  const id = requestIdFrom(request.headers["x-request-id"]);
  reply.header("x-request-id", id);
  sendError(reply, invalidRequest(null, `Malformed request URL: ${error.message}`), id);
}
