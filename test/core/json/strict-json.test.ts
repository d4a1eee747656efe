import { setImmediate as nextTurn } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { ApiError } from "../../../src/core/errors/index.js";
import {
  type ExactInteger,
  JSON_SLICE_BYTES,
  JsonNumberText,
  jsonNumberToDouble,
  MAX_JSON_DEPTH,
  parseStrictJson,
  parseStrictJsonAsync,
  readExactInteger,
  readExactIntegerText,
} from "../../../src/core/json/strict-json.js";

function parseError(body: string | Uint8Array): ApiError {
  try {
    parseStrictJson(body);
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error("parsed without an error");
}

/** The one number of `[text]`. */
const numberOf = (text: string): unknown => (parseStrictJson(`[${text}]`) as unknown[])[0];

describe("numbers: a plain number where a double cannot mislead, else the source text", () => {
  it.each([
    ["0", 0],
    ["-0", -0],
    ["42", 42],
    ["-7", -7],
    ["1.0", 1],
    ["1e3", 1000],
    ["1.5e3", 1500],
    ["0.5", 0.5],
    ["-1.25e-3", -0.00125],
    ["0.0123456789", 0.0123456789],
    ["123456789012345", 123456789012345],
    ["0.000000000000000000000000001", 1e-27],
    ["1.5e-299", 1.5e-299],
    ["900719925474099", 900719925474099],
    ["9007199254740991", 9007199254740991],
    ["-9007199254740991", -9007199254740991],
    ["1000000000000000.000", 1e15],
    ["0.10000000149011612", 0.10000000149011612],
    ["1.5e-301", 1.5e-301],
    ["5e-324", 5e-324],
  ])("%s → the number %d", (text, value) => {
    const parsed = numberOf(text);
    expect(typeof parsed).toBe("number");
    expect(Object.is(parsed, value)).toBe(true);
  });

  it.each([
    "9007199254740992",
    "9007199254740993",
    "9223372036854775807",
    "-9223372036854775808",
    "1.0000000000000000001",
    "1e20",
    "1e308",
    "1.5e300",
    "1e400",
    "-1e400",
    "1e-400",
    "0.99999999999999999999",
    "2.0000000000000001",
    "1e999999999999",
    `1${"0".repeat(100_000)}1`,
  ])("%s → its text", (text) => {
    const parsed = numberOf(text);
    expect(parsed).toBeInstanceOf(JsonNumberText);
    expect((parsed as JsonNumberText).text).toBe(text);
    expect(Object.is(jsonNumberToDouble(parsed as JsonNumberText), Number(text))).toBe(true);
  });

  it("every plain number is what JSON.parse gives", () => {
    const texts = [
      "0.1",
      "0.7",
      "1.1",
      "2.5e-5",
      "-0.95",
      "3.141592653589793",
      "0.30000000000000004",
      "1e-22",
      "4.9e-290",
      "123.456e2",
    ];
    const parsed = parseStrictJson(`[${texts.join(",")}]`) as number[];
    expect(parsed).toEqual(JSON.parse(`[${texts.join(",")}]`));
  });
});

describe("readExactInteger: decimal arithmetic, one scan", () => {
  const integer = (value: bigint): ExactInteger => ({ kind: "integer", value });
  const fraction: ExactInteger = { kind: "fraction" };
  const huge: ExactInteger = { kind: "huge" };
  const zeros = "0".repeat(100_000);

  it.each<[string, ExactInteger]>([
    ["12", integer(12n)],
    ["-1.0", integer(-1n)],
    ["1e3", integer(1000n)],
    ["1.5e3", integer(1500n)],
    ["100e-2", integer(1n)],
    ["0.0e5", integer(0n)],
    ["-0", integer(0n)],
    ["9223372036854775807", integer(9223372036854775807n)],
    ["-9223372036854775808", integer(-9223372036854775808n)],
    ["9999999999999999999", integer(9999999999999999999n)],
    ["10000000000000000000", huge],
    ["1e19", huge],
    ["1e999999999999", huge],
    ["1.5", fraction],
    ["1e-3", fraction],
    ["12.340e1", fraction],
    ["1e-999999999999", fraction],
    ["0e-999999999999", integer(0n)],
    // The shapes that made the old trailing-zero regex quadratic.
    [`1${zeros}1`, huge],
    [`1${zeros}`, huge],
    [`1${zeros}e-100000`, integer(1n)],
    [`1.${zeros}`, integer(1n)],
    [`1.${zeros}1`, fraction],
    [`0.${zeros}`, integer(0n)],
    // Not JSON numbers: read as fractions (never an integer).
    ["", fraction],
    ["-", fraction],
    ["1.", fraction],
    ["1e", fraction],
    ["abc", fraction],
    ["1 ", fraction],
  ])("%s", (text, expected) => {
    expect(readExactIntegerText(text)).toEqual(expected);
    if (text !== "" && !Number.isNaN(Number(text)) && /^-?\d/.test(text) && !/[ .]$|e$/.test(text)) {
      // The same reading from the parsed value, plain number or text.
      expect(readExactInteger(numberOf(text) as number | JsonNumberText)).toEqual(expected);
    }
  });
});

describe("objects, strings and the rest of the grammar", () => {
  it("keeps a __proto__ key as an own property and never changes a prototype", () => {
    const parsed = parseStrictJson('{"__proto__": {"polluted": true}, "constructor": 1}') as Record<
      string,
      unknown
    >;
    expect(Object.keys(parsed)).toEqual(["__proto__", "constructor"]);
    expect(Object.getPrototypeOf(parsed)).toBe(Object.prototype);
    expect(Object.getOwnPropertyDescriptor(parsed, "__proto__")?.value).toEqual({ polluted: true });
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect((parsed as { polluted?: unknown }).polluted).toBeUndefined();
  });

  it("keeps a key repeated with the same value once (objects compared key by key, in any order)", () => {
    expect(parseStrictJson('{"a": [1, {"x": 1, "y": "z"}], "b": 2, "a": [1, {"y": "z", "x": 1.0}]}')).toEqual(
      {
        a: [1, { x: 1, y: "z" }],
        b: 2,
      },
    );
    expect(parseStrictJson('{"s": 9223372036854775807, "s": 9223372036854775807}')).toEqual({
      s: new JsonNumberText("9223372036854775807"),
    });
  });

  it.each([
    ['{"a": 1, "a": 2}', 'repeated key "a" has a different value at position 15'],
    ['{"a": {"x": 1}, "a": {"x": 1, "y": 2}}', 'repeated key "a" has a different value'],
    ['{"a": [1, 2], "a": [1]}', 'repeated key "a" has a different value'],
    ['{"s": 9223372036854775807, "s": 9223372036854775806}', 'repeated key "s" has a different value'],
    ['{"a": null, "a": false}', 'repeated key "a" has a different value'],
    ['{"a": 0, "a": -0}', 'repeated key "a" has a different value'],
  ])("refuses a key repeated with a different value: %s", (text, message) => {
    const err = parseError(text);
    expect([err.status, err.code, err.param]).toEqual([400, "invalid_request", null]);
    expect(err.message).toContain(message);
  });

  it("reads strings: escapes, surrogate pairs, multi-byte UTF-8", () => {
    const text = String.raw`["a\"b\\c\/d\b\f\n\r\t", "\u00e9\u20AC", "\ud83d\ude00", "\uD83D\uDE00", "é → 😀", ""]`;
    expect(parseStrictJson(text)).toEqual(JSON.parse(text));
  });

  it.each([
    [String.raw`["\ud800"]`, String.raw`\ud800 at position 2`],
    [String.raw`["a\udc00"]`, String.raw`\udc00 at position 3`],
    [String.raw`["\ud800\u0041"]`, String.raw`\ud800 at position 2`],
    [String.raw`["\ud800\ud800\udc00"]`, String.raw`\ud800 at position 2`],
    [String.raw`["\ud83d😀"]`, String.raw`\ud83d at position 2`],
    [String.raw`{"k\uDBFF": 1}`, String.raw`\uDBFF at position 3`],
  ])("refuses a lone surrogate escape, which JSON.parse keeps: %s", (text, where) => {
    expect(() => JSON.parse(text)).not.toThrow();
    expect(() => parseStrictJson(text)).toThrow(
      `The request body is not valid JSON: the escape ${where} is a lone surrogate: a string holds Unicode characters only.`,
    );
  });

  it("accepts JSON whitespace anywhere between tokens", () => {
    expect(parseStrictJson(' \t\r\n{ "a" \n: [ 1 ,\t2 ] ,"b":{ } , "c" : [ ] } \n')).toEqual({
      a: [1, 2],
      b: {},
      c: [],
    });
  });

  it.each([
    ["{", "expected a key in double quotes but found the end of the body"],
    ['{"a" 1}', "expected ':' after a key but found '1' at position 5"],
    ['{"a": 1,}', "expected a key in double quotes but found '}' at position 8"],
    ["[1,]", "expected a JSON value but found ']' at position 3"],
    ["[1 2]", "expected ',' or ']' after an array item but found '2' at position 3"],
    ['{"a": 1} {}', "expected the end of the body but found '{' at position 9"],
    ["01", "expected the end of the body but found '1' at position 1"],
    ["[-]", "expected a digit but found ']' at position 2"],
    ["[1.]", "expected a digit after '.' but found ']' at position 3"],
    ["[1e+]", "expected a digit in the exponent but found ']' at position 4"],
    ["[.5]", "expected a JSON value but found '.' at position 1"],
    ["[+1]", "expected a JSON value but found '+' at position 1"],
    ["[NaN]", "expected a JSON value but found 'N' at position 1"],
    ["[tru]", "expected a JSON value but found 't' at position 1"],
    ['["a', "the string that starts at position 1 never ends"],
    [
      '["a\tb"]',
      "expected a character of a string (control characters are escaped) but found U+0009 at position 3",
    ],
    ['["\\x"]', "expected an escape"],
    ['["\\u12G4"]', "expected four hexadecimal digits after \\u"],
    ["[1] é", "expected the end of the body but found U+00E9 at position 4"],
  ])("malformed: %s", (text, detail) => {
    const err = parseError(text);
    expect([err.status, err.code, err.param]).toEqual([400, "invalid_request", null]);
    expect(err.message).toContain(`The request body is not valid JSON: ${detail}`);
    expect(err.message).toMatch(/\.$/);
  });

  it(`nests at most ${MAX_JSON_DEPTH} arrays and objects`, () => {
    const deep = (depth: number) =>
      `${"[".repeat(depth % 2)}${'{"a":['.repeat(depth >> 1)}1${"]}".repeat(depth >> 1)}${"]".repeat(depth % 2)}`;
    expect(() => parseStrictJson(deep(MAX_JSON_DEPTH))).not.toThrow();
    expect(() => parseStrictJson(deep(MAX_JSON_DEPTH - 1))).not.toThrow();
    expect(parseError(deep(MAX_JSON_DEPTH + 1)).message).toBe(
      "The request body is not valid JSON: it is nested too deeply.",
    );
    expect(parseError("[".repeat(1_000_000)).message).toBe(
      "The request body is not valid JSON: it is nested too deeply.",
    );
  });

  it.each([
    ["empty", "", "The request body is empty: send a JSON object."],
    ["JSON whitespace only", " \r\n\t", "The request body is empty: send a JSON object."],
    [
      "a BOM",
      Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d]),
      "The request body is not valid JSON: it starts with a byte order mark (U+FEFF), which JSON does not allow.",
    ],
    [
      "invalid UTF-8",
      Buffer.from([0x5b, 0x22, 0xff, 0x22, 0x5d]),
      "The request body is not valid JSON: it is not valid UTF-8 text.",
    ],
  ])("refuses %s", (_, body, message) => {
    const err = parseError(body);
    expect([err.status, err.code, err.param, err.message]).toEqual([400, "invalid_request", null, message]);
  });
});

describe("parseStrictJsonAsync: the same parse, yielding between slices", () => {
  it("gives what parseStrictJson gives, whatever the slice size", async () => {
    const text = JSON.stringify({
      prompt: Array.from({ length: 300 }, (_, i) => i * 7919),
      apply_steering_vectors: [
        {
          activations: [
            [0.5, -1.25e-3, 3],
            [1e-7, 2, 4],
          ],
          layer_indices: [1, 2],
        },
      ],
      s: ["a", "é", "\n", { __proto__: null, x: [[], {}] }],
    }).replace("7919", "9223372036854775807");
    const expected = parseStrictJson(text);
    for (const slice of [1, 2, 3, 7, 64, 1000, JSON_SLICE_BYTES]) {
      expect(await parseStrictJsonAsync(Buffer.from(text), slice)).toEqual(expected);
    }
  });

  it("lets the event loop turn between slices (a counter on setImmediate advances)", async () => {
    const body = Buffer.from(`[${Array.from({ length: 400_000 }, (_, i) => i).join(",")}]`);
    const slices = Math.floor(body.length / JSON_SLICE_BYTES);
    expect(slices).toBeGreaterThanOrEqual(8);
    let turns = 0;
    let parsing = true;
    const tick = async () => {
      while (parsing) {
        await nextTurn();
        turns++;
      }
    };
    const ticking = tick();
    const parsed = (await parseStrictJsonAsync(body)) as number[];
    parsing = false;
    await ticking;
    expect(parsed.length).toBe(400_000);
    expect(turns).toBeGreaterThanOrEqual(slices - 1);
    // The sync parse of the same body lets nothing else run.
    turns = 0;
    parsing = true;
    const ticking2 = tick();
    parseStrictJson(body);
    const turnsDuringSyncParse = turns;
    parsing = false;
    await ticking2;
    expect(turnsDuringSyncParse).toBe(0);
  });

  it("refuses what parseStrictJson refuses, with the same message", async () => {
    for (const text of ['{"a": 1, "a": 2}', "[1, 2", `[${"1,".repeat(1000)}x]`]) {
      await expect(parseStrictJsonAsync(Buffer.from(text), 16)).rejects.toThrow(parseError(text).message);
    }
  });
});
