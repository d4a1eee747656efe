import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  type Base64Source,
  base64Chunks,
  base64Length,
  jsonStringOf,
  jsonText,
  jsonTextByteLength,
  jsonTextChunks,
  jsonTextToString,
} from "../../../src/core/json-text/index.js";

/** A source giving `bytes` cut at `cuts` (sorted offsets), reusing one buffer for every piece. */
function cutSource(bytes: Uint8Array, cuts: number[]): Base64Source {
  return {
    byteLength: bytes.length,
    *chunks() {
      const scratch = new Uint8Array(bytes.length);
      let from = 0;
      for (const to of [...cuts, bytes.length]) {
        scratch.set(bytes.subarray(from, to));
        yield scratch.subarray(0, to - from); // overwritten by the next piece
        from = to;
      }
    },
  };
}

const bytesAndCuts = fc.uint8Array({ maxLength: 400 }).chain((bytes) =>
  fc.tuple(
    fc.constant(bytes),
    fc
      .uniqueArray(fc.integer({ min: 0, max: bytes.length }), { maxLength: 8 })
      .map((c) => c.sort((a, b) => a - b)),
  ),
);

describe("base64Chunks", () => {
  it("is standard padded base64 of the bytes however the source cuts them (property)", () => {
    fc.assert(
      fc.property(bytesAndCuts, ([bytes, cuts]) => {
        const text = [...base64Chunks(cutSource(bytes, cuts))].join("");
        expect(text).toBe(Buffer.from(bytes).toString("base64"));
        expect(text.length).toBe(base64Length(bytes.length));
      }),
    );
  });

  it("writes 1 MiB in pieces of 64 KiB, never whole", () => {
    const bytes = new Uint8Array(2 ** 20).map((_, i) => i * 31);
    const pieces = [...base64Chunks({ byteLength: bytes.length, chunks: () => [bytes] })];
    expect(pieces.length).toBeGreaterThan(20);
    expect(Math.max(...pieces.map((p) => p.length))).toBe(64 * 1024);
    expect(pieces.join("")).toBe(Buffer.from(bytes).toString("base64"));
  });

  it("refuses a source that gives other than its byteLength", () => {
    const liar: Base64Source = { byteLength: 5, chunks: () => [new Uint8Array(4)] };
    expect(() => [...base64Chunks(liar)]).toThrow(/declared 5 bytes but gave 4/);
  });
});

describe("JsonText", () => {
  it("jsonStringOf is JSON.stringify of the text, without writing it whole (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.oneof(fc.string(), bytesAndCuts), { maxLength: 6 }), (raw) => {
        const parts = raw.map((p) => (typeof p === "string" ? p : cutSource(p[0], p[1])));
        const text = jsonText(parts);
        const whole = jsonTextToString(text);
        const quoted = jsonStringOf(text);
        expect(jsonTextToString(quoted)).toBe(JSON.stringify(whole));
        expect(jsonTextByteLength(quoted)).toBe(Buffer.byteLength(JSON.stringify(whole)));
        expect([...jsonTextChunks(text)].join("")).toBe(whole);
      }),
    );
  });

  it("joins adjacent literals and drops empty ones", () => {
    const source: Base64Source = { byteLength: 0, chunks: () => [] };
    expect(jsonText(["[", "", '"', source, '"', "]"]).parts).toEqual(['["', source, '"]']);
  });
});
