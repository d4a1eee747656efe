// parseJsonOrdered: the values of JSON.parse, the source order of integer-like keys, and the
// errors (SyntaxError, message and position) of each way a text is not JSON.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { orderedEntries, parseJsonOrdered } from "../../src/upstream/index.js";

describe("parseJsonOrdered", () => {
  it("gives the same values as JSON.parse (property)", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        const text = JSON.stringify(value);
        expect(parseJsonOrdered(text)).toStrictEqual(JSON.parse(text));
        const spaced = JSON.stringify(value, null, 2);
        expect(parseJsonOrdered(spaced)).toStrictEqual(JSON.parse(spaced));
      }),
      { numRuns: 500 },
    );
  });

  it("keeps the source order of integer-like keys", () => {
    const o = parseJsonOrdered('{"b": 1, "10": 2, "a": 3, "2": 4}') as Record<string, number>;
    expect(Object.keys(o)).toStrictEqual(["2", "10", "b", "a"]);
    expect(orderedEntries(o)).toStrictEqual([
      ["b", 1],
      ["10", 2],
      ["a", 3],
      ["2", 4],
    ]);
  });

  it("decodes escapes, keeps __proto__ as data, and refuses invalid JSON", () => {
    const o = parseJsonOrdered('{"__proto__": {"x": 1}, "s": "a\\"b\\\\\\u00e9\\n"}') as Record<
      string,
      unknown
    >;
    expect(Object.getPrototypeOf(o)).toBe(Object.prototype);
    expect(Object.hasOwn(o, "__proto__")).toBe(true);
    expect(o.s).toBe('a"b\\é\n');
    for (const bad of ["", "{", '{"a" 1}', "[1,]", "01", '"\u0001"', "nul", "1 2", '{"a":1,}']) {
      expect(() => parseJsonOrdered(bad), bad).toThrow(SyntaxError);
    }
  });
});

describe("parseJsonOrdered's errors and repeated keys", () => {
  it("names what it expected and where", () => {
    const cases: [string, string][] = [
      ["", "Unexpected token at position 0 of JSON"],
      ["{", "Expected a key at position 1 of JSON"],
      ['{"a" 1}', "Expected ':' at position 6 of JSON"],
      ["[1,]", "Unexpected token at position 3 of JSON"],
      ["01", "Unexpected data after JSON at position 1 of JSON"],
      ["nul", "Unexpected token at position 0 of JSON"],
      ["1 2", "Unexpected data after JSON at position 2 of JSON"],
      ['{"a":1,}', "Expected a key at position 7 of JSON"],
      ['"abc', "Unterminated string at position 0 of JSON"],
      ['{"a":1 "b"}', "Expected ',' or '}' at position 8 of JSON"],
      ["[1 2]", "Expected ',' or ']' at position 4 of JSON"],
      ["{1:2}", "Expected a key at position 1 of JSON"],
      ["-", "Unexpected token at position 0 of JSON"],
      ["tru", "Unexpected token at position 0 of JSON"],
      [' [ "x\\" ', "Unterminated string at position 3 of JSON"],
      ['{"a":}', "Unexpected token at position 5 of JSON"],
      ["]", "Unexpected token at position 0 of JSON"],
    ];
    for (const [bad, message] of cases) {
      expect(() => parseJsonOrdered(bad), bad).toThrow(new SyntaxError(message));
    }
  });

  it("leaves a string with escapes or control characters to JSON.parse (its errors)", () => {
    for (const bad of ['"\u0001"', '"\\x"']) {
      let native: unknown;
      try {
        JSON.parse(bad);
      } catch (err) {
        native = err;
      }
      expect(native).toBeInstanceOf(SyntaxError);
      expect(() => parseJsonOrdered(bad), bad).toThrow(native as SyntaxError);
    }
  });

  it("keeps a repeated key's last value at its first position", () => {
    const o = parseJsonOrdered('{"1": "a", "b": 2, "1": "c"}') as Record<string, unknown>;
    expect(orderedEntries(o)).toStrictEqual([
      ["1", "c"],
      ["b", 2],
    ]);
    const plain = parseJsonOrdered('{"b": 1, "b": 2, "a": 3}') as Record<string, unknown>;
    expect(orderedEntries(plain)).toStrictEqual([
      ["b", 2],
      ["a", 3],
    ]);
    expect(Object.getOwnPropertySymbols(plain)).toStrictEqual([]);
  });
});
