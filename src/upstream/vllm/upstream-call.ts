// What both kinds of upstream call share (src/upstream/vllm/upstream-stream.ts, json-call.ts): the
// errors of a caller's abort, one shared listener per caller signal, the headers, the body in and out.
import type { Readable } from "node:stream";
import { ApiError } from "../../core/errors/index.js";
import type { VllmRequestBody } from "./build-vllm-request.js";
import { parseVllmJson } from "./parse-vllm-response.js";
import type { VllmClientOptions } from "./vllm-client-types.js";

export const canceled = (): ApiError => new ApiError("canceled", "The request was canceled.");

/**
 * Why the caller's signal aborted, as the error the call ends with: the signal's own reason when
 * it is a `deadline_exceeded` ApiError (a deadline the caller set, e.g. Connect-Timeout-Ms), else
 * `canceled`.
 */
export const callerAbort = (signal: AbortSignal): ApiError =>
  signal.reason instanceof ApiError && signal.reason.code === "deadline_exceeded"
    ? signal.reason
    : canceled();

/**
 * The links waiting on each caller signal, behind one `abort` listener per signal however many
 * calls share it: a request tokenizes its prompts concurrently under one signal, and an
 * EventTarget with more than 10 listeners prints MaxListenersExceededWarning.
 */
export const followers = new WeakMap<AbortSignal, { links: Set<() => void>; fire: () => void }>();

/** Runs `onAbort` when `signal` aborts; returns the function that stops following it. */
export function follow(signal: AbortSignal, onAbort: () => void): () => void {
  let entry = followers.get(signal);
  if (entry === undefined) {
    const links = new Set<() => void>();
    const fire = (): void => {
      followers.delete(signal);
      for (const link of links) link();
    };
    signal.addEventListener("abort", fire, { once: true });
    entry = { links, fire };
    followers.set(signal, entry);
  }
  const { links, fire } = entry;
  links.add(onAbort);
  return () => {
    links.delete(onAbort);
    if (links.size === 0 && followers.get(signal) === entry) {
      followers.delete(signal);
      signal.removeEventListener("abort", fire);
    }
  };
}

export function parseJson(text: string, what: string): unknown {
  try {
    return parseVllmJson(text);
  } catch (cause) {
    throw new ApiError("upstream_error", `Inference sent a ${what} that is not JSON.`, { cause });
  }
}

/**
 * A JSON body as bytes of their own. undici turns a string body into `Buffer.from(string)` — for a
 * small one, a slice of Node's shared 8 KiB pool — and keeps it until the response ends: a stream
 * would pin a pool slab for minutes. A stream body passes through.
 */
export function ownBytes(body: VllmRequestBody["body"], byteLength: number): Buffer | Readable {
  if (typeof body !== "string") return body;
  const bytes = Buffer.allocUnsafeSlow(byteLength);
  bytes.write(body, "utf8");
  return bytes;
}

/** A whole answer's bytes as text, as undici's body.text() reads them: UTF-8, a BOM skipped. */
export function bodyText(chunks: readonly Buffer[]): string {
  const bytes = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
  const bom = bytes.length > 2 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
  return bytes.toString("utf8", bom ? 3 : 0);
}

/** The headers of one upstream call (made by {@link upstreamHeaders}). */
export type HeadersFor = (spec: {
  accept: string;
  requestId: string;
  /** A JSON body's length in bytes; undefined without a body. */
  contentLength?: number | undefined;
  headers?: Readonly<Record<string, string>> | undefined;
}) => Record<string, string>;

/**
 * The headers of a client's upstream calls: the call's own (a `traceparent`), `accept`,
 * `x-request-id`, the JSON body's type and length, and `Authorization: Bearer <apiKey>` when the
 * client has a key.
 */
export function upstreamHeaders(opts: Pick<VllmClientOptions, "apiKey">): HeadersFor {
  return (spec) => {
    const h: Record<string, string> = {
      ...spec.headers,
      accept: spec.accept,
      "x-request-id": spec.requestId,
    };
    if (spec.contentLength !== undefined) {
      h["content-type"] = "application/json";
      // Needed for a streamed body (undici would send it chunked); undici checks it either way.
      h["content-length"] = String(spec.contentLength);
    }
    if (opts.apiKey !== undefined) h.authorization = `Bearer ${opts.apiKey}`;
    return h;
  };
}
