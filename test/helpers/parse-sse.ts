/** One SSE block as the tests see it: a `data:` event (JSON or `[DONE]`) or a `:` comment. */
export type SseBlock = { kind: "data"; data: unknown } | { kind: "done" } | { kind: "comment"; text: string };

/**
 * Parses an SSE body into blocks, strictly: each block ends with a blank line and holds exactly one
 * `data: ` line or one `: ` comment line. Any other field (`event:`, `id:`, `retry:`) or a
 * truncated block throws, so a test fails on it.
 */
export function parseSse(body: string): SseBlock[] {
  if (body === "") return [];
  if (!body.endsWith("\n\n"))
    throw new Error(`SSE body does not end with a blank line: ${JSON.stringify(body.slice(-40))}`);
  return body
    .slice(0, -2)
    .split("\n\n")
    .map((block): SseBlock => {
      if (block.includes("\n"))
        throw new Error(`SSE block with more than one line: ${JSON.stringify(block)}`);
      if (block.startsWith(": ")) return { kind: "comment", text: block.slice(2) };
      if (!block.startsWith("data: "))
        throw new Error(`SSE line that is not data or a comment: ${JSON.stringify(block)}`);
      const data = block.slice("data: ".length);
      return data === "[DONE]" ? { kind: "done" } : { kind: "data", data: JSON.parse(data) };
    });
}

/** The blocks without keepalive comments. */
export function withoutKeepalives(blocks: SseBlock[]): SseBlock[] {
  return blocks.filter((b) => !(b.kind === "comment" && b.text === "keepalive"));
}

/**
 * The JSON payloads of a whole SSE body that ends with `data: [DONE]` (throws otherwise), in
 * order, keepalive comments skipped.
 */
export function sseChunks<T = Record<string, unknown>>(body: string): T[] {
  const blocks = parseSse(body).filter((b) => b.kind !== "comment");
  const last = blocks.pop();
  if (last?.kind !== "done") throw new Error("SSE body does not end with data: [DONE]");
  return blocks.map((b) => {
    if (b.kind !== "data") throw new Error("[DONE] before the end of the stream");
    return b.data as T;
  });
}
