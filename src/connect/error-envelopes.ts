import {
  Code,
  ConnectError,
  type ConnectRouter,
  createContextKey,
  createContextValues,
  type Interceptor,
} from "@connectrpc/connect";
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
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { decodeContentEncoding } from "../core/index.js";
import { ApiError, type ErrorCode, errorCatalogue, newRequestId } from "../errors/index.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../service/checks.js";
import { toConnectError } from "./error-conversion.js";
import { explainProtocolError } from "./explain-protocol-error.js";
import { type BinaryBodyForm, refuseLongPromptLists } from "./prompt-list-wire-count.js";
import { protocolErrorResponse, rpcErrorForm } from "./protocol-error.js";
import { requestIdKey } from "./routes.js";

/** Options of {@link withErrorEnvelopes}. */
export interface ErrorEnvelopeOptions {
  /** The router's `readMaxBytes`: limit of a message in bytes. */
  readonly readMaxBytes: number;
  /** Called for every refusal that becomes a 500 (connect-es failed on its own). */
  readonly onInternalError?: (err: unknown, requestId: string) => void;
}

/**
 * The request body as received, kept until connect-es has parsed the request message (then
 * released, see {@link releaseParsedBody}), to explain a parse error in the API's words.
 */
class BodyCapture {
  #chunks: Uint8Array[] | undefined = [];
  #size = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Uint8Array): void {
    if (this.#chunks === undefined) return;
    this.#size += chunk.byteLength;
    if (this.#size > this.limit) this.#chunks = undefined;
    else this.#chunks.push(chunk);
  }

  release(): void {
    this.#chunks = undefined;
  }

  /** The bytes kept; undefined once released (or past the limit). */
  bytes(): Uint8Array | undefined {
    return this.#chunks === undefined ? undefined : Buffer.concat(this.#chunks, this.#size);
  }
}

const bodyCaptureKey = createContextKey<BodyCapture | undefined>(undefined, {
  description: "acs request body kept for error explanations",
});

async function* tee(body: AsyncIterable<Uint8Array>, capture: BodyCapture): AsyncIterable<Uint8Array> {
  for await (const chunk of body) {
    capture.push(chunk);
    yield chunk;
  }
}

async function* releaseWhenRead<T>(messages: AsyncIterable<T>, capture: BodyCapture): AsyncIterable<T> {
  for await (const message of messages) yield message;
  capture.release();
}

/**
 * Interceptor (put it on the router) that drops the body {@link withErrorEnvelopes} kept once
 * connect-es has parsed the request: at once for unary calls (interceptors run after parsing),
 * after the last input message for streams. A long call then holds no second copy of its body.
 */
export const releaseParsedBody: Interceptor = (next) => async (req) => {
  const capture = req.contextValues.get(bodyCaptureKey);
  if (capture === undefined) return next(req);
  if (!req.stream) {
    capture.release();
    return next(req);
  }
  return next({ ...req, message: releaseWhenRead(req.message, capture) });
};

function hasEnvelope(err: ConnectError): boolean {
  return err.findDetails(ErrorEnvelopeSchema).length > 0;
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

async function readAll(body: AsyncIterable<Uint8Array> | undefined): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  if (body !== undefined) for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** True when `chunk` holds only whole frames, none of them one `isLast` picks. */
function wholeFramesNoLast(chunk: Uint8Array, isLast: (flags: number) => boolean): boolean {
  let offset = 0;
  while (offset < chunk.byteLength) {
    if (chunk.byteLength - offset < 5) return false;
    if (isLast(chunk[offset] as number)) return false;
    const length =
      (chunk[offset + 1] as number) * 0x1000000 +
      ((chunk[offset + 2] as number) << 16) +
      ((chunk[offset + 3] as number) << 8) +
      (chunk[offset + 4] as number);
    offset += 5 + length;
  }
  return offset === chunk.byteLength;
}

/**
 * Passes an enveloped body through, replacing the last frame (the one `isLast` says by its flags)
 * with what `fix` returns (undefined: kept). A chunk that holds only whole frames and no last
 * frame — what connect-es yields for each message — is passed on as it is, with no copy and one
 * await; other chunks are split into frames. `return` and `throw` reach the inner iterator, so a
 * write error still reaches connect-es's handler.
 */
function fixLastFrame(
  body: AsyncIterable<Uint8Array>,
  isLast: (flags: number) => boolean,
  fix: (flags: number, data: Uint8Array) => Promise<Uint8Array | undefined>,
): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      const it = body[Symbol.asyncIterator]();
      let pending: Uint8Array = new Uint8Array(0);
      const queue: Uint8Array[] = [];
      let ended = false;
      const split = async (chunk: Uint8Array): Promise<void> => {
        const buf = pending.byteLength === 0 ? chunk : Buffer.concat([pending, chunk]);
        let offset = 0;
        let passFrom = 0;
        while (buf.byteLength - offset >= 5) {
          const view = new DataView(buf.buffer, buf.byteOffset + offset, 5);
          const end = offset + 5 + view.getUint32(1);
          if (end > buf.byteLength) break;
          const flags = view.getUint8(0);
          if (isLast(flags)) {
            if (offset > passFrom) queue.push(buf.subarray(passFrom, offset));
            queue.push((await fix(flags, buf.subarray(offset + 5, end))) ?? buf.subarray(offset, end));
            passFrom = end;
          }
          offset = end;
        }
        if (offset > passFrom) queue.push(buf.subarray(passFrom, offset));
        pending = offset === buf.byteLength ? new Uint8Array(0) : buf.slice(offset);
      };
      return {
        async next(): Promise<IteratorResult<Uint8Array>> {
          for (;;) {
            const queued = queue.shift();
            if (queued !== undefined) return { done: false, value: queued };
            if (ended) return { done: true, value: undefined };
            const r = await it.next();
            if (r.done === true) {
              ended = true;
              if (pending.byteLength > 0) queue.push(pending);
              continue;
            }
            if (pending.byteLength === 0 && wholeFramesNoLast(r.value, isLast)) return r;
            await split(r.value);
          }
        },
        return: (value?: unknown) => it.return?.(value) ?? Promise.resolve({ done: true, value: undefined }),
        throw: (err?: unknown) => it.throw?.(err) ?? Promise.reject(err),
      };
    },
  };
}

/** Passes `body` through and runs `atEnd` once it has ended, before reporting the end. */
function thenAtEnd(body: AsyncIterable<Uint8Array>, atEnd: () => Promise<void>): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      const it = body[Symbol.asyncIterator]();
      return {
        async next(): Promise<IteratorResult<Uint8Array>> {
          const r = await it.next();
          if (r.done === true) await atEnd();
          return r;
        },
        return: (value?: unknown) => it.return?.(value) ?? Promise.resolve({ done: true, value: undefined }),
        throw: (err?: unknown) => it.throw?.(err) ?? Promise.reject(err),
      };
    },
  };
}

/** What an early refusal of connect-es (a bare 405, 415 or 505) means, in the API's words. */
function earlyRefusal(
  res: UniversalServerResponse,
  handler: UniversalHandler,
  req: UniversalServerRequest,
): ApiError {
  const path = new URL(req.url).pathname;
  const target = `${handler.service.typeName}/${handler.method.name}`;
  if (res.status === 405) {
    return new ApiError(
      "method_not_allowed",
      `Method ${req.method} is not allowed on ${path}; use ${handler.allowedMethods.join(" or ")}.`,
    );
  }
  if (res.status === 505) {
    return new ApiError(
      "method_not_allowed",
      `${target} is a bidirectional stream: call it with gRPC over HTTP/2 (this request came over HTTP/${req.httpVersion}).`,
    );
  }
  const types =
    handler.method.methodKind === "unary"
      ? "application/json or application/proto (Connect), application/grpc (gRPC) or application/grpc-web (gRPC-Web)"
      : handler.method.methodKind === "server_streaming"
        ? "application/connect+json or application/connect+proto (Connect), application/grpc (gRPC) or application/grpc-web (gRPC-Web)"
        : "application/grpc (gRPC)";
  const sent = req.header.get("content-type");
  const what =
    sent === null || sent === "" ? "No Content-Type" : `Unsupported Content-Type '${sent.slice(0, 64)}'`;
  return new ApiError("unsupported_media_type", `${what} for ${path}: send ${types}.`);
}

/**
 * How a completion request's binary body carries its message, when its prompt list is counted on
 * the wire (src/connect/prompt-list-wire-count.ts): a Connect unary body with no compression, or
 * enveloped frames (a compressed frame is skipped there); undefined for JSON and other methods.
 */
function promptListForm(handler: UniversalHandler, header: Headers): BinaryBodyForm | undefined {
  if (handler.method.input.typeName !== CreateCompletionRequestSchema.typeName) return undefined;
  const type = (header.get("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
  if (framedBinaryTypes.has(type)) return "frames";
  if (type !== "application/proto") return undefined;
  const encoding = (header.get("content-encoding") ?? "identity").trim().toLowerCase();
  return encoding === "identity" ? "message" : undefined;
}

const framedBinaryTypes = new Set([
  "application/connect+proto",
  "application/grpc",
  "application/grpc+proto",
  "application/grpc-web",
  "application/grpc-web+proto",
]);

function wrap(handler: UniversalHandler, opts: ErrorEnvelopeOptions): UniversalHandler {
  async function withEnvelopes(request: UniversalServerRequest): Promise<UniversalServerResponse> {
    const contextValues = request.contextValues ?? createContextValues();
    const requestId = contextValues.get(requestIdKey) ?? newRequestId();
    const body = request.body;
    let capture: BodyCapture | undefined;
    let req = request;
    if (
      handler.method.methodKind !== "bidi_streaming" &&
      handler.method.methodKind !== "client_streaming" &&
      typeof body === "object" &&
      body !== null &&
      Symbol.asyncIterator in body
    ) {
      capture = new BodyCapture(opts.readMaxBytes + 5);
      contextValues.set(bodyCaptureKey, capture);
      const kept = capture;
      const teed = tee(body as AsyncIterable<Uint8Array>, kept);
      const form = promptListForm(handler, request.header);
      req = {
        ...request,
        contextValues,
        body:
          form === undefined
            ? teed
            : refuseLongPromptLists(
                teed,
                form,
                () => kept.bytes(),
                maxPromptsPerRequest,
                () => toConnectError(tooManyPrompts(), requestId),
              ),
      };
    }
    const contentType = req.header.get("content-type");

    /** The envelope error that replaces a bare one connect-es raised. */
    const explain = async (err: ConnectError): Promise<ConnectError> => {
      const api = await explainProtocolError(err, {
        method: handler.method,
        httpMethod: req.method,
        url: req.url,
        header: req.header,
        body: () => capture?.bytes(),
        readMaxBytes: opts.readMaxBytes,
      });
      capture?.release();
      if (api.code === "internal_error") opts.onInternalError?.(err, requestId);
      return replacement(api, requestId, err);
    };

    let res: UniversalServerResponse;
    try {
      res = await handler(req);
    } catch (err) {
      const cause = ConnectError.from(err, Code.Internal);
      return protocolErrorResponse(contentType, await explain(cause), 500);
    }

    if (res.body === undefined && res.status >= 400) {
      capture?.release();
      const api = earlyRefusal(res, handler, req);
      const out = protocolErrorResponse(contentType, toConnectError(api, requestId), api.status);
      if (api.code === "method_not_allowed" && res.status === 405) {
        out.header?.set("allow", handler.allowedMethods.join(", "));
      }
      return out;
    }

    switch (rpcErrorForm(contentType)) {
      case "connect": {
        if (res.status === 200) return res;
        const raw = await readAll(res.body);
        const header = new Headers(res.header);
        const encoding = header.get("content-encoding");
        const json = encoding === null ? raw : await decodeContentEncoding(raw, encoding, 16 * 1024 * 1024);
        const parsed = errorFromJsonBytes(
          json,
          undefined,
          new ConnectError("the error body is not a Connect error", Code.Internal),
        );
        if (hasEnvelope(parsed)) {
          const code = envelopeCode(parsed);
          const status = code === undefined ? res.status : errorCatalogue[code].status;
          return { ...res, status, body: createAsyncIterable([raw]) };
        }
        const err = await explain(parsed);
        const out = protocolErrorResponse(
          contentType,
          err,
          errorCatalogue[envelopeCode(err) ?? "internal_error"].status,
        );
        for (const name of ["content-type", "content-length", "content-encoding"]) header.delete(name);
        out.header?.forEach((value, key) => {
          header.set(key, value);
        });
        return { ...out, header };
      }
      case "connect-stream": {
        if (res.body === undefined) return res;
        const responseEncoding = new Headers(res.header).get("connect-content-encoding");
        const fixed = fixLastFrame(
          res.body,
          (flags) => (flags & endStreamFlag) === endStreamFlag,
          async (flags, data) => {
            const compressed = (flags & 0b1) !== 0 && responseEncoding !== null;
            if (!compressed && !mayHoldError(data)) return undefined;
            const json = compressed
              ? await decodeContentEncoding(data, responseEncoding, 16 * 1024 * 1024)
              : data;
            const end = endStreamFromJson(json);
            if (end.error === undefined || hasEnvelope(end.error)) return undefined;
            const err = await explain(end.error);
            const text = JSON.stringify(endStreamToJson(end.metadata, err, {}));
            return encodeEnvelope(endStreamFlag, new TextEncoder().encode(text));
          },
        );
        return { ...res, body: fixed };
      }
      case "grpc-web": {
        if (res.body === undefined) return res;
        const responseEncoding = new Headers(res.header).get("grpc-encoding");
        const fixed = fixLastFrame(
          res.body,
          (flags) => (flags & trailerFlag) === trailerFlag,
          async (flags, data) => {
            const bytes =
              (flags & 0b1) === 0 || responseEncoding === null
                ? data
                : await decodeContentEncoding(data, responseEncoding, 16 * 1024 * 1024);
            const trailer = trailerParse(bytes);
            const bare = findTrailerError(trailer);
            if (bare === undefined || hasEnvelope(bare)) return undefined;
            const err = await explain(bare);
            return encodeEnvelope(trailerFlag, trailerSerialize(setTrailerStatus(trailer, err)));
          },
        );
        return { ...res, body: fixed };
      }
      case "grpc": {
        const trailer = res.trailer;
        if (res.body === undefined || trailer === undefined) return res;
        const fixed = thenAtEnd(res.body, async () => {
          const bare = findTrailerError(trailer);
          if (bare !== undefined && !hasEnvelope(bare)) setTrailerStatus(trailer, await explain(bare));
        });
        return { ...res, body: fixed };
      }
    }
  }
  return Object.assign(withEnvelopes, {
    service: handler.service,
    method: handler.method,
    requestPath: handler.requestPath,
    supportedContentType: handler.supportedContentType,
    protocolNames: handler.protocolNames,
    allowedMethods: handler.allowedMethods,
  });
}

/**
 * Wraps `routes` so that every error of every RPC carries the acs.v1.ErrorEnvelope detail, also
 * when connect-es raises it itself, before or around our handlers: a body it cannot parse (binary
 * or JSON, in the REST decoder's words and with the field as `param`), an unknown field, an
 * unsupported compression or Content-Type, a method it does not take (Connect GET of a method with
 * side effects), a message over `readMaxBytes` (no Content-Length needed), a caller's deadline.
 * Each registered universal handler is replaced by one that runs it and rewrites a bare error in
 * its protocol's own form (Connect JSON body, Connect end-stream frame, gRPC trailers, gRPC-Web
 * trailer frame); errors that already carry the envelope pass unchanged. Connect unary errors
 * answer with the catalogue's HTTP status (REST's), not connect-es's code→status table.
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
