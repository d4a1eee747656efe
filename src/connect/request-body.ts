// The request body of an RPC as the error envelopes (src/connect/error-envelopes.ts) pass it to
// connect-es: a completion's binary prompt list counted on the wire, and the bytes kept — only
// where a refusal may have to be explained from them — until connect-es has parsed the message.
import { type ContextValues, createContextKey, type Interceptor } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerRequest } from "@connectrpc/connect/protocol";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../service/checks.js";
import { toConnectError } from "./error-conversion.js";
import { type BinaryBodyForm, refuseLongPromptLists } from "./prompt-list-wire-count.js";
import { isJsonContentType, rpcErrorForm } from "./protocol-error.js";

/**
 * The request body as received, kept until connect-es has parsed the request message (then
 * released, see {@link releaseParsedBody}), to explain a parse error in the API's words.
 */
export class BodyCapture {
  #chunks: Uint8Array[] | undefined = [];
  #size = 0;

  constructor(private readonly limit: number) {}

  /** True once the body passed the limit: its bytes are not kept. */
  overflowed = false;

  push(chunk: Uint8Array): void {
    if (this.#chunks === undefined) return;
    this.#size += chunk.byteLength;
    if (this.#size > this.limit) {
      this.#chunks = undefined;
      this.overflowed = true;
    } else this.#chunks.push(chunk);
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

/**
 * Whether a refusal of `handler`'s calls is explained from what the request was (its body, its
 * headers): for unary and server-streaming methods; a client or bidirectional stream's is not.
 */
export function explainsRequest(handler: UniversalHandler): boolean {
  const kind = handler.method.methodKind;
  return kind !== "bidi_streaming" && kind !== "client_streaming";
}

/**
 * False for a Connect unary JSON message sent uncompressed: whatever refuses it that needs its
 * bytes, our strict decoder, carries its own error (src/connect/carried-refusal.ts). Every other
 * body may have to be explained from its bytes: its framing, its compression, protobuf-es's reason
 * (connect-es keeps none of its own, test/connect/connect-es-behaviours.test.ts).
 */
function keepsBody(header: Headers): boolean {
  const type = header.get("content-type");
  if (rpcErrorForm(type) !== "connect" || !isJsonContentType(type ?? "")) return true;
  const encoding = header.get("content-encoding");
  return encoding !== null && encoding !== "identity";
}

const framedBinaryTypes = new Set([
  "application/connect+proto",
  "application/grpc",
  "application/grpc+proto",
  "application/grpc-web",
  "application/grpc-web+proto",
]);

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

function isByteStream(body: UniversalServerRequest["body"]): body is AsyncIterable<Uint8Array> {
  return typeof body === "object" && body !== null && Symbol.asyncIterator in body;
}

/** `request` as connect-es gets it, and the body kept of it (undefined: none). */
export interface ObservedRequest {
  readonly req: UniversalServerRequest;
  readonly capture: BodyCapture | undefined;
}

/**
 * `request` with its body passed through for `handler`: kept (up to `limit` bytes, in
 * `contextValues` for {@link releaseParsedBody}, which the request then carries) where
 * {@link keepsBody}, and a
 * completion's binary prompt list refused on the wire once it holds more prompts than any cap
 * allows (the ConnectError of `tooManyPrompts` for `requestId`, before protobuf-es decodes it).
 * Client and bidirectional streams pass unchanged.
 */
export function observeRequestBody(
  handler: UniversalHandler,
  request: UniversalServerRequest,
  contextValues: ContextValues,
  limit: number,
  requestId: string,
): ObservedRequest {
  const body = request.body;
  if (!explainsRequest(handler) || !isByteStream(body) || !keepsBody(request.header)) {
    return { req: request, capture: undefined };
  }
  const capture = new BodyCapture(limit);
  contextValues.set(bodyCaptureKey, capture);
  const teed = tee(body, capture);
  const form = promptListForm(handler, request.header);
  const passed =
    form === undefined
      ? teed
      : refuseLongPromptLists(
          teed,
          form,
          () => capture.bytes(),
          maxPromptsPerRequest,
          () => toConnectError(tooManyPrompts(), requestId),
        );
  return { req: { ...request, contextValues, body: passed }, capture };
}
