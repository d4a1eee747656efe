// The request body of an RPC as the error envelopes (src/surfaces/rpc/error-envelopes.ts) pass it to
// connect-es: a completion's binary prompt list counted on the wire, and the bytes kept — only
// where a refusal may have to be explained from them — until connect-es has parsed the message.
import { type ContextValues, createContextKey, type Interceptor } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerRequest } from "@connectrpc/connect/protocol";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../../service/checks.js";
import { toConnectError } from "./error-conversion.js";
import { FrameTally } from "./frame-reader.js";
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

  push(chunk: Uint8Array): void {
    if (this.#chunks === undefined) return;
    this.#size += chunk.byteLength;
    if (this.#size > this.limit) this.#chunks = undefined;
    else this.#chunks.push(chunk);
  }

  /** False once released or past the limit: {@link bytes} is undefined then. */
  get kept(): boolean {
    return this.#chunks !== undefined;
  }

  release(): void {
    this.#chunks = undefined;
  }

  /** The bytes kept; undefined once released (or past the limit). */
  bytes(): Uint8Array | undefined {
    return this.#chunks === undefined ? undefined : Buffer.concat(this.#chunks, this.#size);
  }
}

/** What is kept of a request body (its bytes, or its frames counted), until it is released. */
interface KeptBody {
  release(): void;
}

const keptBodyKey = createContextKey<KeptBody | undefined>(undefined, {
  description: "acs request body kept for error explanations",
});

async function* tee(body: AsyncIterable<Uint8Array>, capture: BodyCapture): AsyncIterable<Uint8Array> {
  for await (const chunk of body) {
    capture.push(chunk);
    yield chunk;
  }
}

/**
 * `messages`, with `capture` released once they ended after one at least: a stream that sent none
 * keeps its (empty) body, so that its refusal is explained as a unary call's ("no message").
 */
async function* releaseWhenRead<T>(messages: AsyncIterable<T>, capture: KeptBody): AsyncIterable<T> {
  let read = false;
  for await (const message of messages) {
    read = true;
    yield message;
  }
  if (read) capture.release();
}

/**
 * Interceptor (put it on the router) that drops what {@link withErrorEnvelopes} kept of the body
 * (its bytes, or its frames counted) once connect-es has parsed the request: at once for unary calls (interceptors run after parsing),
 * after the last input message for streams. A long call then holds no second copy of its body.
 */
export const releaseParsedBody: Interceptor = (next) => async (req) => {
  const capture = req.contextValues.get(keptBodyKey);
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

/** The header that names the compression of a request's messages, per protocol. */
const messageEncodingHeader = {
  connect: "content-encoding",
  "connect-stream": "connect-content-encoding",
  grpc: "grpc-encoding",
  "grpc-web": "grpc-encoding",
} as const;

/**
 * How much of a body is kept to explain a refusal: nothing for a JSON message sent uncompressed —
 * whatever refuses it that needs its bytes, our strict decoder, carries its own error
 * (src/surfaces/rpc/carried-refusal.ts) — but, when framed, its frames counted as they pass (a fault of
 * the framing comes first); every other body whole, for its compression or protobuf-es's reason
 * (connect-es keeps none of its own, test/surfaces/rpc/connect-es-behaviours.test.ts).
 */
function keptOf(header: Headers): "bytes" | "frames" | "nothing" {
  const type = header.get("content-type");
  if (!isJsonContentType(type ?? "")) return "bytes";
  const form = rpcErrorForm(type);
  const encoding = header.get(messageEncodingHeader[form]);
  if (encoding !== null && encoding !== "identity") return "bytes";
  return form === "connect" ? "nothing" : "frames";
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
 * the wire (src/surfaces/rpc/prompt-list-wire-count.ts): a Connect unary body with no compression, or
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

/** `request` as connect-es gets it, and what is kept of its body (undefined: nothing). */
export interface ObservedRequest {
  readonly req: UniversalServerRequest;
  readonly capture: BodyCapture | undefined;
  readonly tally: FrameTally | undefined;
}

async function* counted(body: AsyncIterable<Uint8Array>, tally: FrameTally): AsyncIterable<Uint8Array> {
  for await (const chunk of body) {
    tally.push(chunk);
    yield chunk;
  }
}

/**
 * `request` with its body passed through for `handler`, kept as {@link keptOf} says (up to `limit`
 * bytes; what is kept is in `contextValues`, which the request then carries, for
 * {@link releaseParsedBody}), and a completion's binary prompt list refused on the wire once it
 * holds more prompts than any cap allows (the ConnectError of `tooManyPrompts` for `requestId`,
 * before protobuf-es decodes it). Client and bidirectional streams pass unchanged.
 */
export function observeRequestBody(
  handler: UniversalHandler,
  request: UniversalServerRequest,
  contextValues: ContextValues,
  limit: number,
  requestId: string,
): ObservedRequest {
  const body = request.body;
  const kept = keptOf(request.header);
  if (!explainsRequest(handler) || !isByteStream(body) || kept === "nothing") {
    return { req: request, capture: undefined, tally: undefined };
  }
  if (kept === "frames") {
    const tally = new FrameTally(limit);
    contextValues.set(keptBodyKey, tally);
    return { req: { ...request, contextValues, body: counted(body, tally) }, capture: undefined, tally };
  }
  const capture = new BodyCapture(limit);
  contextValues.set(keptBodyKey, capture);
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
  return { req: { ...request, contextValues, body: passed }, capture, tally: undefined };
}
