import { createParser, type EventSourceMessage, type ParseError } from "eventsource-parser";
import { ApiError } from "../../errors/index.js";

/**
 * Longest SSE data buffered across reads, in characters (a vLLM chunk is a few hundred bytes).
 * A memory bound on a stream that never ends its line or event.
 */
export const DEFAULT_MAX_SSE_EVENT_CHARS = 4 * 1024 * 1024;

/**
 * The `data` of each SSE event in a byte stream (vLLM's `data: <json>` + blank line), decoded
 * with eventsource-parser. UTF-8 safe across reads (a character split between two reads is
 * joined by a streaming TextDecoder); comments (`: keepalive`) are skipped; an incomplete last
 * event is dropped (as the SSE spec says) — the caller notices the missing `[DONE]`.
 *
 * Throws ApiError 502 `upstream_error` for garbage: invalid UTF-8, a line that is no SSE field,
 * an event type other than `message`, or more than `maxEventChars` buffered across reads.
 * Stopping early (break / return) returns the byte iterator, which for a Node stream destroys
 * it — and with it the upstream connection.
 */
export async function* decodeSse(
  chunks: AsyncIterable<Uint8Array>,
  options: { maxEventChars?: number } = {},
): AsyncGenerator<string, void, undefined> {
  const pending: string[] = [];
  let failure: ApiError | undefined;
  const fail = (message: string, cause?: unknown): void => {
    failure ??= new ApiError("upstream_error", message, { cause });
  };
  const parser = createParser({
    maxBufferSize: options.maxEventChars ?? DEFAULT_MAX_SSE_EVENT_CHARS,
    onEvent(event: EventSourceMessage) {
      if (failure !== undefined) return; // nothing after garbage counts (not even a [DONE])
      if (event.event !== undefined && event.event !== "message") {
        fail(`Inference sent an unexpected SSE event type ${JSON.stringify(event.event)}.`);
        return;
      }
      pending.push(event.data);
    },
    onError(error: ParseError) {
      fail(`Inference sent a malformed event stream (${error.type}).`, error);
    },
  });
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const feed = (text: string): void => {
    if (failure === undefined && text !== "") parser.feed(text);
  };
  const decode = (bytes?: Uint8Array): string => {
    try {
      return bytes === undefined ? decoder.decode() : decoder.decode(bytes, { stream: true });
    } catch (cause) {
      fail("Inference sent an event stream that is not UTF-8.", cause);
      return "";
    }
  };
  for await (const chunk of chunks) {
    feed(decode(chunk));
    // Events parsed before a failure in the same read are still delivered, in order.
    while (pending.length > 0) yield pending.shift() as string;
    if (failure !== undefined) throw failure;
  }
  feed(decode());
  while (pending.length > 0) yield pending.shift() as string;
  if (failure !== undefined) throw failure;
}
