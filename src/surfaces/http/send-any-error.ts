// Errors answered before or beside a route, in the form the caller reads: an RPC (by path or
// Content-Type) gets its protocol's (Connect JSON, gRPC trailers, gRPC-Web, Connect end-stream),
// anything else the REST envelope. build-server.ts uses them in its hooks and handlers.
import type { FastifyReply, FastifyRequest } from "fastify";
import type { ApiError } from "../../core/errors/index.js";
import { apiErrorFrom, requestIdOf, sendError } from "../rest/index.js";
import { toConnectError, writeProtocolError } from "../rpc/index.js";

/** The path of an RPC: /<package>.<Service>/<Method> (Connect, gRPC and gRPC-Web). */
const rpcPath = /^\/[A-Za-z_][\w.]*\.[A-Za-z_]\w*\/[A-Za-z_]\w*$/;

/** True for an RPC path (a query string is ignored). */
function isRpcPath(url: string): boolean {
  return rpcPath.test(url.split("?", 1)[0] ?? "");
}

/**
 * True when a request is an RPC and gets its errors in its protocol's form (see
 * `writeProtocolError`): an RPC path, or a gRPC, gRPC-Web or Connect streaming Content-Type on
 * any path (such a client cannot read a REST body).
 */
export function isRpcRequest(request: FastifyRequest): boolean {
  const type = (request.headers["content-type"] ?? "").toLowerCase();
  return (
    isRpcPath(request.url) || type.startsWith("application/grpc") || type.startsWith("application/connect+")
  );
}

/**
 * Answers an RPC request with `err` in its protocol's form (Connect JSON, gRPC trailers, gRPC-Web
 * trailer frame, Connect end-stream), with the envelope detail, the X-Request-Id and the headers
 * already set on the reply (CORS).
 */
export function sendRpcError(request: FastifyRequest, reply: FastifyReply, err: ApiError): FastifyReply {
  const id = requestIdOf(reply);
  reply.hijack();
  for (const [name, value] of Object.entries(reply.getHeaders())) {
    if (value !== undefined) reply.raw.setHeader(name, value);
  }
  writeProtocolError(request.headers["content-type"], toConnectError(err, id), err.status, reply.raw);
  return reply;
}

/** Any error as its surface's error: the REST envelope, or the RPC form for an RPC request. */
export function sendAnyError(request: FastifyRequest, reply: FastifyReply, err: unknown): FastifyReply {
  if (isRpcRequest(request)) return sendRpcError(request, reply, apiErrorFrom(err));
  return sendError(reply, err, requestIdOf(reply));
}
