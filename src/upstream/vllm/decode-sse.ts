import { createParser, type EventSourceMessage, type ParseError } from "eventsource-parser";
import { ApiError } from "../../core/errors/index.js";

/**
 * Longest SSE data buffered across reads, in characters (a vLLM chunk is a few hundred bytes).
 * A memory bound on a stream that never ends its line or event.
 */
export const DEFAULT_MAX_SSE_EVENT_CHARS = 4 * 1024 * 1024;

/** A push decoder of an SSE byte stream (see {@link createSseDecoder}). */
export interface SseDecoder {
  /** Decodes one read: `onData` runs for each event it completes, in order. */
  push(bytes: Uint8Array): void;
  /** The end of the stream: flushes the UTF-8 decoder (an incomplete last event is dropped). */
  end(): void;
  /** The ApiError 502 `upstream_error` the bytes so far earned, if any (then nothing more is decoded). */
  failure(): ApiError | undefined;
}

/**
 * The `data` of each SSE event in a byte stream (vLLM's `data: <json>` + blank line), pushed read by
 * read, decoded with eventsource-parser: `onData` is called synchronously for each event. UTF-8
 * safe across reads (a streaming, fatal TextDecoder); comments (`: keepalive`) are skipped.
 * Garbage (invalid UTF-8, a line that is no SSE field, an event type other than `message`, more
 * than `maxEventChars` buffered across reads) sets {@link SseDecoder.failure}; events completed
 * before it in the same read are still passed on, nothing after it is.
 */
export function createSseDecoder(
  onData: (data: string) => void,
  options: { maxEventChars?: number } = {},
): SseDecoder {
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
      onData(event.data);
    },
    onError(error: ParseError) {
      fail(`Inference sent a malformed event stream (${error.type}).`, error);
    },
  });
  const decoder = new TextDecoder("utf-8", { fatal: true });
  const feed = (text: string): void => {
    if (failure === undefined && text !== "") parser.feed(text);
  };
  return {
    push(bytes) {
      if (failure !== undefined) return;
      let text: string;
      try {
        text = decoder.decode(bytes, { stream: true });
      } catch (cause) {
        fail("Inference sent an event stream that is not UTF-8.", cause);
        return;
      }
      feed(text);
    },
    end() {
      if (failure !== undefined) return;
      let text: string;
      try {
        text = decoder.decode();
      } catch (cause) {
        fail("Inference sent an event stream that is not UTF-8.", cause);
        return;
      }
      feed(text);
    },
    failure: () => failure,
  };
}

/**
 * The `data` of each SSE event in a byte stream, as {@link createSseDecoder} decodes them; an
 * incomplete last event is dropped (as the SSE spec says) — the caller notices the missing `[DONE]`.
 *
 * Throws ApiError 502 `upstream_error` for garbage (see {@link createSseDecoder}), after the events
 * decoded before it in the same read. Stopping early (break / return) returns the byte iterator,
 * which for a Node stream destroys it — and with it the upstream connection.
 */
export async function* decodeSse(
  chunks: AsyncIterable<Uint8Array>,
  options: { maxEventChars?: number } = {},
): AsyncGenerator<string, void, undefined> {
  const pending: string[] = [];
  const sse = createSseDecoder((data) => pending.push(data), options);
  for await (const chunk of chunks) {
    sse.push(chunk);
    // Events parsed before a failure in the same read are still delivered, in order.
    while (pending.length > 0) yield pending.shift() as string;
    const failure = sse.failure();
    if (failure !== undefined) throw failure;
  }
  sse.end();
  while (pending.length > 0) yield pending.shift() as string;
  const failure = sse.failure();
  if (failure !== undefined) throw failure;
}
