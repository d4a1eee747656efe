import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/core/errors/index.js";
import { decodeSse } from "../../src/upstream/index.js";

const enc = new TextEncoder();

async function* fragments(bytes: Uint8Array, cuts: number[]): AsyncGenerator<Uint8Array> {
  let at = 0;
  for (const cut of [...cuts].sort((a, b) => a - b)) {
    yield bytes.subarray(at, cut);
    at = cut;
  }
  yield bytes.subarray(at);
}

async function decodeAll(chunks: AsyncIterable<Uint8Array>): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const data of decodeSse(chunks)) out.push(data === "[DONE]" ? data : JSON.parse(data));
  return out;
}

// Multi-byte UTF-8 everywhere: 2-byte é, 3-byte 日本, 4-byte 🦙, and CRLF / LF line ends, a comment.
const events = [
  { choices: [{ index: 0, text: "h\u00e9" }] },
  { choices: [{ index: 1, text: "\u65e5\u672c" }] },
  { choices: [{ index: 0, text: "\ud83e\udd99 \ud83e\udd99" }] },
  { choices: [], usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 } },
];
const text = `${events
  .map((e, i) =>
    i % 2 === 0 ? `data: ${JSON.stringify(e)}\n\n` : `: keepalive\r\ndata: ${JSON.stringify(e)}\r\n\r\n`,
  )
  .join("")}data: [DONE]\n\n`;
const bytes = enc.encode(text);
const expected = [...events, "[DONE]"];

describe("decodeSse", () => {
  it("decodes the whole stream in one read", async () => {
    expect(await decodeAll(fragments(bytes, []))).toStrictEqual(expected);
  });

  it("gives the same events for every split into two reads (mid-line, mid-UTF-8 character)", async () => {
    for (let cut = 1; cut < bytes.length; cut++) {
      expect(await decodeAll(fragments(bytes, [cut]))).toStrictEqual(expected);
    }
  });

  it("gives the same events one byte at a time", async () => {
    const cuts = Array.from({ length: bytes.length - 1 }, (_, i) => i + 1);
    expect(await decodeAll(fragments(bytes, cuts))).toStrictEqual(expected);
  });

  it("gives the same events for arbitrary fragmentations (property)", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.uniqueArray(fc.integer({ min: 1, max: bytes.length - 1 }), { maxLength: 40 }),
        async (cuts) => {
          expect(await decodeAll(fragments(bytes, cuts))).toStrictEqual(expected);
        },
      ),
      { numRuns: 200 },
    );
  });

  it("joins a multi-line data field with newlines, as SSE says", async () => {
    const out: string[] = [];
    for await (const d of decodeSse(fragments(enc.encode("data: a\ndata: b\n\n"), [8]))) out.push(d);
    expect(out).toStrictEqual(["a\nb"]);
  });

  it("drops an incomplete last event (the caller then misses [DONE])", async () => {
    const out: string[] = [];
    for await (const d of decodeSse(fragments(enc.encode('data: {"a":1}\n\ndata: [DO'), []))) out.push(d);
    expect(out).toStrictEqual(['{"a":1}']);
  });

  it.each([
    ["a line that is no SSE field", "data: 1\n\nwhat is this\n\ndata: 2\n\n"],
    ["an event type", "data: 1\n\nevent: ping\ndata: 2\n\n"],
    ["invalid UTF-8", "data: 1\n\ndata: \u00ff\n\n"],
  ])("throws 502 upstream_error for %s, after the events before it", async (name, raw) => {
    const input =
      name === "invalid UTF-8"
        ? Uint8Array.from([...enc.encode("data: 1\n\ndata: "), 0xff, 0x0a, 0x0a])
        : enc.encode(raw);
    const out: string[] = [];
    const err = await (async () => {
      for await (const d of decodeSse(fragments(input, [9]))) out.push(d);
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).code).toBe("upstream_error");
    expect(out).toStrictEqual(["1"]);
  });

  it("throws 502 when an event buffered across reads exceeds the size cap", async () => {
    const big = enc.encode(`data: ${"x".repeat(2000)}\n\n`);
    const cuts = Array.from({ length: 20 }, (_, i) => (i + 1) * 100);
    const err = await (async () => {
      for await (const _ of decodeSse(fragments(big, cuts), { maxEventChars: 1000 })) {
        /* drain */
      }
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect((err as ApiError).code).toBe("upstream_error");
  });

  it("returns the byte iterator when the consumer stops early", async () => {
    let returned = false;
    const source: AsyncIterable<Uint8Array> = {
      [Symbol.asyncIterator]() {
        let i = 0;
        return {
          next: async () => ({ done: false, value: enc.encode(`data: ${i++}\n\n`) }),
          return: async () => {
            returned = true;
            return { done: true, value: undefined };
          },
        };
      },
    };
    for await (const d of decodeSse(source)) if (d === "2") break;
    expect(returned).toBe(true);
  });
});
