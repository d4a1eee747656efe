// One fast-check property of the strict JSON decoder (src/core/json/strict-json.ts and the request
// decoder on top), checked against references written independently of it: exact decimal
// arithmetic on BigInt for numbers, JSON.parse for syntax. Its inputs reach the hard cases: digit
// runs thousands long, exponents far beyond a double, nesting around the 512-level limit, arrays of
// thousands of numbers, escapes and lone surrogates, duplicate and prototype keys, and bodies cut
// or corrupted anywhere. The suite runs it a few hundred times (test/surfaces/rest/strict-json.property
// .test.ts); `npm run soak -- json` runs it 100,000 times.
import fc from "fast-check";
import { ApiError } from "../../src/core/errors/index.js";
import {
  type ExactInteger,
  JsonNumberText,
  jsonNumberToDouble,
  MAX_JSON_DEPTH,
  parseStrictJson,
  parseStrictJsonAsync,
  readExactInteger,
} from "../../src/core/json/strict-json.js";
import { decodeCompletionRequest } from "../../src/surfaces/rest/decode-completion-request.js";

// ---------------------------------------------------------------- references

/** Readings of number texts seen lately (big arrays repeat a few texts thousands of times). */
const readings = new Map<string, ExactInteger>();

/** The exact reading of a JSON number text, by BigInt arithmetic (test code: clarity over speed). */
export function referenceExactInteger(text: string): ExactInteger {
  const known = readings.get(text);
  if (known !== undefined) return known;
  if (readings.size > 10_000) readings.clear();
  const reading = readExactly(text);
  readings.set(text, reading);
  return reading;
}

function readExactly(text: string): ExactInteger {
  const match = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
  if (match === null) throw new Error(`not a JSON number: ${text}`);
  const [, sign = "", whole = "", fraction = "", exponentText = "0"] = match;
  const all = whole + fraction;
  const significant = all.replace(/^0+/, "");
  if (significant === "") return { kind: "integer", value: 0n };
  const trimmed = significant.replace(/0+$/, "");
  const scale = BigInt(exponentText) - BigInt(fraction.length) + BigInt(significant.length - trimmed.length);
  if (scale < 0n) return { kind: "fraction" };
  if (BigInt(trimmed.length) + scale > 19n) return { kind: "huge" };
  const magnitude = BigInt(trimmed) * 10n ** scale;
  return { kind: "integer", value: sign === "-" ? -magnitude : magnitude };
}

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** What parseStrictJson must give for a number text: the double, or the text (see its doc). */
export function referenceNumber(text: string): number | JsonNumberText {
  const exact = referenceExactInteger(text);
  const double = Number(text);
  if (exact.kind === "integer") {
    return exact.value >= -MAX_SAFE && exact.value <= MAX_SAFE ? double : new JsonNumberText(text);
  }
  if (exact.kind === "huge") return new JsonNumberText(text);
  return Number.isFinite(double) && !Number.isInteger(double) ? double : new JsonNumberText(text);
}

// ---------------------------------------------------------------- documents

/** A JSON document as generated: the source text of every leaf, so both sides can be derived. */
type Doc =
  | { readonly t: "num"; readonly text: string }
  | { readonly t: "str"; readonly text: string; readonly value: string }
  | { readonly t: "lit"; readonly value: true | false | null }
  | { readonly t: "arr"; readonly items: readonly Doc[] }
  | { readonly t: "obj"; readonly entries: readonly (readonly [Key, Doc])[] };
type Key = { readonly text: string; readonly value: string };

const DIGITS = [..."0123456789"];
const shortDigits = fc.string({ unit: fc.constantFrom(...DIGITS), minLength: 1, maxLength: 8 });
/** Digit strings: short random ones, with runs of one digit up to 2,000 long. */
const digitString = fc
  .array(
    fc.oneof(
      { weight: 8, arbitrary: shortDigits },
      {
        weight: 1,
        arbitrary: fc
          .tuple(fc.constantFrom("0", "9", "1", "5"), fc.integer({ min: 1, max: 2000 }))
          .map(([d, n]) => d.repeat(n)),
      },
    ),
    { minLength: 1, maxLength: 3 },
  )
  .map((parts) => parts.join(""));

/** Number texts as clients write them in big arrays: token ids, JS and Python floats. */
const shortNumberText: fc.Arbitrary<string> = fc.oneof(
  fc.integer({ min: 0, max: 128_000 }).map(String),
  fc.double({ noNaN: true, noDefaultInfinity: true }).map((x) => JSON.stringify(x)),
  fc.float({ noNaN: true, noDefaultInfinity: true }).map(String),
  fc.tuple(fc.constantFrom("", "-"), shortDigits, shortDigits).map(([s, a, b]) => `${s}0.${a}${b}`),
);

/**
 * Integers (int64 and a little beyond) written other ways: with zeros after a decimal point, or
 * their digits shifted by an exponent (`9007199254740993.000`, `123000e-3`, `1.23e2`).
 */
const rewrittenInteger: fc.Arbitrary<string> = fc
  .tuple(
    fc.bigInt({ min: -(2n ** 65n), max: 2n ** 65n }),
    fc.nat({ max: 25 }),
    fc.constantFrom("point", "zeros", "shift"),
  )
  .map(([value, k, how]) => {
    const sign = value < 0n ? "-" : "";
    const digits = (value < 0n ? -value : value).toString();
    if (how === "point") return `${sign}${digits}.${"0".repeat(k + 1)}`;
    if (how === "zeros") return digits === "0" ? `0e-${k}` : `${sign}${digits}${"0".repeat(k)}e-${k}`;
    const at = Math.max(1, digits.length - k);
    const shifted = at < digits.length ? `${digits.slice(0, at)}.${digits.slice(at)}` : digits;
    return `${sign}${shifted}e${digits.length - at}`;
  });

/** JSON number texts: every part of the grammar, long digit runs, huge and tiny exponents. */
export const numberText: fc.Arbitrary<string> = fc.oneof(
  { weight: 4, arbitrary: rewrittenInteger },
  {
    weight: 4,
    arbitrary: fc
      .tuple(
        fc.constantFrom("", "-"),
        fc.oneof(
          fc.constant("0"),
          fc.tuple(fc.constantFrom(..."123456789"), fc.option(digitString)).map(([d, r]) => d + (r ?? "")),
        ),
        fc.option(digitString.map((d) => `.${d}`)),
        fc.option(
          fc
            .tuple(
              fc.constantFrom("e", "E"),
              fc.constantFrom("", "+", "-"),
              fc.oneof(fc.integer({ min: 0, max: 400 }).map(String), digitString),
            )
            .map((parts) => parts.join("")),
        ),
      )
      .map(([sign, whole, fraction, exponent]) => sign + whole + (fraction ?? "") + (exponent ?? "")),
  },
  { weight: 2, arbitrary: fc.double({ noNaN: true, noDefaultInfinity: true }).map((x) => JSON.stringify(x)) },
  { weight: 1, arbitrary: fc.float({ noNaN: true, noDefaultInfinity: true }).map(String) },
  { weight: 2, arbitrary: fc.integer().map(String) },
  { weight: 1, arbitrary: fc.bigInt({ min: -(2n ** 64n), max: 2n ** 64n }).map(String) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      "9007199254740991",
      "9007199254740992",
      "9223372036854775807",
      "-9223372036854775808",
      "1e400",
      "-1e-400",
      "0.99999999999999999999",
      "2.0000000000000001",
      "5e-324",
      "1.7976931348623157e308",
      "1e999999999999",
      "1e-999999999999",
    ),
  },
);

const hex4 = (unit: number, upper: boolean): string => {
  const hex = unit.toString(16).padStart(4, "0");
  return upper ? hex.toUpperCase() : hex;
};

/** One piece of a string: raw characters, a short escape, or a \u escape (lone surrogates too: refused). */
const stringPiece: fc.Arbitrary<Key> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc
      .string({ unit: "grapheme", maxLength: 4 })
      .map((s) => [...s].filter((c) => c !== '"' && c !== "\\" && c >= " ").join(""))
      .map((s) => ({ text: s, value: s })),
  },
  {
    weight: 2,
    arbitrary: fc.constantFrom<Key>(
      { text: "\\n", value: "\n" },
      { text: '\\"', value: '"' },
      { text: "\\\\", value: "\\" },
      { text: "\\/", value: "/" },
      { text: "\\b", value: "\b" },
      { text: "\\f", value: "\f" },
      { text: "\\r", value: "\r" },
      { text: "\\t", value: "\t" },
    ),
  },
  {
    weight: 2,
    arbitrary: fc
      .tuple(fc.integer({ min: 0, max: 0xffff }), fc.boolean())
      .map(([unit, upper]) => ({ text: `\\u${hex4(unit, upper)}`, value: String.fromCharCode(unit) })),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(
        fc.constantFrom<Key>(
          { text: "a", value: "a" },
          { text: "é", value: "é" },
          { text: "\\n", value: "\n" },
        ),
        fc.integer({ min: 1, max: 5000 }),
      )
      .map(([p, n]) => ({ text: p.text.repeat(n), value: p.value.repeat(n) })),
  },
);

const stringDoc: fc.Arbitrary<Key> = fc.array(stringPiece, { maxLength: 5 }).map((pieces) => ({
  text: pieces.map((p) => p.text).join(""),
  value: pieces.map((p) => p.value).join(""),
}));

const keyArb: fc.Arbitrary<Key> = fc.oneof(
  { weight: 3, arbitrary: stringDoc },
  {
    weight: 1,
    arbitrary: fc
      .constantFrom("__proto__", "constructor", "prototype", "toString", "hasOwnProperty", "valueOf")
      .map((k) => ({ text: k, value: k })),
  },
);

const leaf: fc.Arbitrary<Doc> = fc.oneof(
  { weight: 4, arbitrary: numberText.map((text): Doc => ({ t: "num", text })) },
  { weight: 2, arbitrary: stringDoc.map((s): Doc => ({ t: "str", ...s })) },
  {
    weight: 1,
    arbitrary: fc.constantFrom<Doc>(
      { t: "lit", value: true },
      { t: "lit", value: false },
      { t: "lit", value: null },
    ),
  },
);

/** Objects: unique keys, then maybe a key repeated (with the same value, or another one). */
function objectOf(value: fc.Arbitrary<Doc>, maxKeys: number): fc.Arbitrary<Doc> {
  return fc
    .tuple(
      fc.uniqueArray(fc.tuple(keyArb, value), { maxLength: maxKeys, selector: ([k]) => k.value }),
      fc.option(fc.tuple(fc.nat(), fc.option(value))),
    )
    .map(([entries, repeat]): Doc => {
      const all: (readonly [Key, Doc])[] = [...entries];
      const picked =
        repeat === null || entries.length === 0 ? undefined : entries[repeat[0] % entries.length];
      if (picked !== undefined && repeat !== null) all.push([picked[0], repeat[1] ?? picked[1]]);
      return { t: "obj", entries: all };
    });
}

const shallowDoc: fc.Arbitrary<Doc> = fc.letrec<{ doc: Doc }>((tie) => ({
  doc: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    leaf,
    fc.array(tie("doc"), { maxLength: 6 }).map((items): Doc => ({ t: "arr", items })),
    objectOf(tie("doc"), 5),
  ),
})).doc;

/** Arrays of thousands of numbers as clients send them (steering rows, token ids). */
const bigArray: fc.Arbitrary<Doc> = fc
  .tuple(fc.array(shortNumberText, { minLength: 1, maxLength: 20 }), fc.integer({ min: 100, max: 3000 }))
  .map(
    ([texts, length]): Doc => ({
      t: "arr",
      items: Array.from({ length }, (_, i): Doc => ({ t: "num", text: texts[i % texts.length] as string })),
    }),
  );

/**
 * A chain of arrays and objects around a document: a leaf within two levels of the limit, or any
 * document 112 levels either side of it.
 */
const deepDoc: fc.Arbitrary<Doc> = fc
  .oneof(
    fc.tuple(fc.integer({ min: MAX_JSON_DEPTH - 2, max: MAX_JSON_DEPTH + 2 }), leaf),
    fc.tuple(fc.integer({ min: MAX_JSON_DEPTH - 112, max: MAX_JSON_DEPTH + 88 }), shallowDoc),
  )
  .chain(([levels, inner]) =>
    fc.array(fc.boolean(), { minLength: 1, maxLength: 7 }).map((kinds) => {
      let doc = inner;
      for (let level = 0; level < levels; level++) {
        doc = kinds[level % kinds.length]
          ? { t: "arr", items: [doc] }
          : { t: "obj", entries: [[{ text: "k", value: "k" }, doc]] };
      }
      return doc;
    }),
  );

const anyDoc: fc.Arbitrary<Doc> = fc.oneof(
  { weight: 6, arbitrary: shallowDoc },
  { weight: 2, arbitrary: bigArray },
  { weight: 1, arbitrary: objectOf(fc.oneof(shallowDoc, bigArray), 4) },
  { weight: 1, arbitrary: deepDoc },
);

const whitespace = fc.array(fc.constantFrom("", "", " ", "\n", "\t", "\r\n", "  "), {
  minLength: 1,
  maxLength: 6,
});

function render(doc: Doc, spaces: readonly string[]): string {
  let turn = 0;
  const ws = () => spaces[turn++ % spaces.length] as string;
  const parts: string[] = [];
  const walk = (node: Doc): void => {
    switch (node.t) {
      case "num":
        parts.push(node.text);
        return;
      case "str":
        parts.push(`"${node.text}"`);
        return;
      case "lit":
        parts.push(String(node.value));
        return;
      case "arr":
        parts.push("[", ws());
        node.items.forEach((item, i) => {
          if (i > 0) parts.push(",", ws());
          walk(item);
          parts.push(ws());
        });
        parts.push("]");
        return;
      case "obj":
        parts.push("{", ws());
        node.entries.forEach(([key, value], i) => {
          if (i > 0) parts.push(",", ws());
          parts.push(`"${key.text}"`, ws(), ":", ws());
          walk(value);
          parts.push(ws());
        });
        parts.push("}");
        return;
    }
  };
  walk(doc);
  return ws() + parts.join("") + ws();
}

function depthOf(doc: Doc): number {
  let deepest = 0;
  const stack: [Doc, number][] = [[doc, 0]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop() as [Doc, number];
    if (node.t === "arr" || node.t === "obj") {
      deepest = Math.max(deepest, depth + 1);
      const children = node.t === "arr" ? node.items : node.entries.map(([, v]) => v);
      for (const child of children) stack.push([child, depth + 1]);
    }
  }
  return deepest;
}

/** Whether two parsed values are the same value, as the parser decides it for repeated keys. */
function sameParsed(a: unknown, b: unknown): boolean {
  if (a instanceof JsonNumberText || b instanceof JsonNumberText) {
    return a instanceof JsonNumberText && b instanceof JsonNumberText && a.text === b.text;
  }
  if (Array.isArray(a) || Array.isArray(b)) {
    return (
      Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => sameParsed(x, b[i]))
    );
  }
  if (typeof a === "object" && a !== null && typeof b === "object" && b !== null) {
    const ka = Object.keys(a);
    const kb = Object.keys(b);
    const ra = a as Record<string, unknown>;
    const rb = b as Record<string, unknown>;
    return ka.length === kb.length && ka.every((k) => Object.hasOwn(rb, k) && sameParsed(ra[k], rb[k]));
  }
  return Object.is(a, b);
}

/** What parseStrictJson must give for a document that it accepts (see firstRefusal). */
function expectedValue(doc: Doc): unknown {
  switch (doc.t) {
    case "num":
      return referenceNumber(doc.text);
    case "str":
      return doc.value;
    case "lit":
      return doc.value;
    case "arr":
      return doc.items.map(expectedValue);
    case "obj": {
      const out: Record<string, unknown> = {};
      for (const [key, value] of doc.entries) {
        const v = expectedValue(value);
        if (Object.hasOwn(out, key.value)) continue;
        Object.defineProperty(out, key.value, {
          value: v,
          writable: true,
          enumerable: true,
          configurable: true,
        });
      }
      return out;
    }
  }
}

// ---------------------------------------------------------------- comparisons

function fail(message: string): never {
  throw new Error(message);
}

/** Structural equality with Object.is on numbers, key order and prototypes checked. */
function assertSame(actual: unknown, expected: unknown, path: string): void {
  if (expected instanceof JsonNumberText) {
    if (!(actual instanceof JsonNumberText) || actual.text !== expected.text) {
      fail(`${path}: expected the text ${expected.text.slice(0, 80)}, got ${String(actual).slice(0, 80)}`);
    }
    return;
  }
  if (typeof expected === "number") {
    if (!Object.is(actual, expected))
      fail(`${path}: expected ${expected}, got ${String(actual).slice(0, 80)}`);
    return;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) fail(`${path}: array length differs`);
    for (let i = 0; i < expected.length; i++) assertSame(actual[i], expected[i], `${path}[${i}]`);
    return;
  }
  if (typeof expected === "object" && expected !== null) {
    if (typeof actual !== "object" || actual === null || Array.isArray(actual))
      fail(`${path}: expected an object`);
    if (Object.getPrototypeOf(actual) !== Object.prototype) fail(`${path}: the prototype changed`);
    const keys = Object.keys(expected);
    const got = Object.keys(actual);
    if (keys.join("\u0000") !== got.join("\u0000"))
      fail(`${path}: keys ${JSON.stringify(got)} ≠ ${JSON.stringify(keys)}`);
    for (const key of keys) {
      const own = Object.getOwnPropertyDescriptor(actual, key);
      assertSame(own?.value, (expected as Record<string, unknown>)[key], `${path}.${key}`);
    }
    return;
  }
  if (actual !== expected)
    fail(
      `${path}: expected ${JSON.stringify(expected)?.slice(0, 80)}, got ${JSON.stringify(actual)?.slice(0, 80)}`,
    );
}

/** Every number of a parsed value reads as an integer exactly as the reference says. */
function assertIntegerReadings(parsed: unknown, doc: Doc): void {
  if (doc.t === "num") {
    const got = readExactInteger(parsed as number | JsonNumberText);
    const want = referenceExactInteger(doc.text);
    if (
      got.kind !== want.kind ||
      (got.kind === "integer" && want.kind === "integer" && got.value !== want.value)
    ) {
      fail(`readExactInteger(${doc.text.slice(0, 80)}) ≠ reference`);
    }
    if (!Object.is(jsonNumberToDouble(parsed as number | JsonNumberText), Number(doc.text))) {
      fail(`jsonNumberToDouble(${doc.text.slice(0, 80)}) ≠ Number()`);
    }
  } else if (doc.t === "arr") {
    doc.items.forEach((item, i) => {
      assertIntegerReadings((parsed as unknown[])[i], item);
    });
  } else if (doc.t === "obj") {
    const seen = new Set<string>();
    for (const [key, value] of doc.entries) {
      if (seen.has(key.value)) continue;
      seen.add(key.value);
      assertIntegerReadings(Object.getOwnPropertyDescriptor(parsed, key.value)?.value, value);
    }
  }
}

type Outcome = { ok: true; value: unknown } | { ok: false; message: string };

function syncOutcome(bytes: Buffer): Outcome {
  try {
    return { ok: true, value: parseStrictJson(bytes) };
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    if (err.status !== 400 || err.code !== "invalid_request" || err.param !== null) {
      fail(`refusal is not a 400 invalid_request with param null: ${err.message}`);
    }
    return { ok: false, message: err.message };
  }
}

async function slicedOutcome(bytes: Buffer, slice: number): Promise<Outcome> {
  try {
    return { ok: true, value: await parseStrictJsonAsync(bytes, slice) };
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    return { ok: false, message: err.message };
  }
}

async function assertSlicedAgrees(bytes: Buffer, outcome: Outcome, slice: number): Promise<void> {
  // At most ~64 slices, so that big bodies do not take thousands of turns.
  const sliced = await slicedOutcome(bytes, Math.max(slice, Math.ceil(bytes.length / 64)));
  if (outcome.ok !== sliced.ok)
    fail(`sliced parse ${sliced.ok ? "accepted" : "refused"} what the parse did not`);
  if (outcome.ok && sliced.ok) assertSame(sliced.value, outcome.value, "sliced");
  if (!outcome.ok && !sliced.ok && outcome.message !== sliced.message) fail("sliced parse: another message");
}

// ---------------------------------------------------------------- the scenarios

/** A lone surrogate in `text` (a `u` regex reads a pair as one code point, a lone half as Cs). */
const hasLoneSurrogate = (text: string): boolean => /\p{Cs}/u.test(text);

/**
 * The first refusal the parser must meet, reading the document in order: a container opened
 * deeper than the limit, a string (or key) holding a lone surrogate, or a key repeated with
 * another value (found when that value ends).
 */
function firstRefusal(doc: Doc, depth = 0): "depth" | "surrogate" | "repeated" | undefined {
  if (doc.t === "str") return hasLoneSurrogate(doc.value) ? "surrogate" : undefined;
  if (doc.t !== "arr" && doc.t !== "obj") return undefined;
  if (depth + 1 > MAX_JSON_DEPTH) return "depth";
  if (doc.t === "arr") {
    for (const item of doc.items) {
      const refusal = firstRefusal(item, depth + 1);
      if (refusal !== undefined) return refusal;
    }
    return undefined;
  }
  const seen = new Map<string, unknown>();
  for (const [key, value] of doc.entries) {
    if (hasLoneSurrogate(key.value)) return "surrogate";
    const refusal = firstRefusal(value, depth + 1);
    if (refusal !== undefined) return refusal;
    const parsed = expectedValue(value);
    if (!seen.has(key.value)) seen.set(key.value, parsed);
    else if (!sameParsed(seen.get(key.value), parsed)) return "repeated";
  }
  return undefined;
}

async function checkDocument(doc: Doc, spaces: readonly string[], slice: number): Promise<void> {
  const bytes = Buffer.from(render(doc, spaces));
  const outcome = syncOutcome(bytes);
  const refusal = firstRefusal(doc);
  if (refusal === "depth") {
    if (outcome.ok || outcome.message !== "The request body is not valid JSON: it is nested too deeply.") {
      fail(`${depthOf(doc)} levels: expected "nested too deeply"`);
    }
  } else if (refusal === "surrogate") {
    if (outcome.ok || !outcome.message.includes("is a lone surrogate"))
      fail("expected a lone surrogate refusal");
  } else if (refusal === "repeated") {
    if (outcome.ok || !outcome.message.includes("repeated key")) fail("expected a repeated key refusal");
  } else {
    if (!outcome.ok) fail(`a valid document was refused: ${outcome.message}`);
    assertSame(outcome.value, expectedValue(doc), "$");
    assertIntegerReadings(outcome.value, doc);
  }
  await assertSlicedAgrees(bytes, outcome, slice);
}

/** JSON.parse's value of the same text, compared with numbers as doubles. */
function assertMatchesJsonParse(actual: unknown, reference: unknown, path: string): void {
  if (actual instanceof JsonNumberText || typeof actual === "number") {
    if (!Object.is(jsonNumberToDouble(actual), reference)) fail(`${path}: number differs from JSON.parse`);
    return;
  }
  if (Array.isArray(actual)) {
    if (!Array.isArray(reference) || reference.length !== actual.length)
      fail(`${path}: differs from JSON.parse`);
    actual.forEach((item, i) => {
      assertMatchesJsonParse(item, reference[i], `${path}[${i}]`);
    });
    return;
  }
  if (typeof actual === "object" && actual !== null) {
    if (typeof reference !== "object" || reference === null) fail(`${path}: differs from JSON.parse`);
    const keys = Object.keys(actual);
    if (keys.length !== Object.keys(reference).length) fail(`${path}: keys differ from JSON.parse`);
    for (const key of keys) {
      const ours = Object.getOwnPropertyDescriptor(actual, key)?.value;
      const theirs = Object.getOwnPropertyDescriptor(reference, key)?.value;
      assertMatchesJsonParse(ours, theirs, `${path}.${key}`);
    }
    return;
  }
  if (actual !== reference) fail(`${path}: differs from JSON.parse`);
}

type Mutation = { at: number; cut: boolean; remove: number; insert: string };

const mutation: fc.Arbitrary<Mutation> = fc.record({
  at: fc.nat(),
  cut: fc.boolean(),
  remove: fc.nat({ max: 3 }),
  insert: fc.string({
    unit: fc.constantFrom(...'{}[]":,\\ 0123456789.eE+-tfnulrsa\u0000\n\té\u2028\ufeff'),
    maxLength: 3,
  }),
});

async function checkCorrupted(
  doc: Doc,
  spaces: readonly string[],
  m: Mutation,
  slice: number,
): Promise<void> {
  const text = render(doc, spaces);
  const at = m.at % (text.length + 1);
  const mutated = m.cut ? text.slice(0, at) : text.slice(0, at) + m.insert + text.slice(at + m.remove);
  const bytes = Buffer.from(mutated);
  const referenceText = bytes.toString("utf8"); // what the bytes say (a cut surrogate pair → U+FFFD)
  let reference: { ok: true; value: unknown } | { ok: false };
  try {
    reference = { ok: true, value: JSON.parse(referenceText) };
  } catch {
    reference = { ok: false };
  }
  const outcome = syncOutcome(bytes);
  if (outcome.ok) {
    if (!reference.ok) fail(`accepted what JSON.parse refuses: ${mutated.slice(0, 120)}`);
    assertMatchesJsonParse(outcome.value, reference.value, "$");
  } else if (reference.ok) {
    const allowed = ["repeated key", "nested too deeply", "The request body is empty", "is a lone surrogate"];
    if (!allowed.some((why) => outcome.message.includes(why))) {
      fail(`refused what JSON.parse accepts (${outcome.message.slice(0, 160)}): ${mutated.slice(0, 120)}`);
    }
  } else if (
    !outcome.message.startsWith("The request body is not valid JSON: ") &&
    outcome.message !== "The request body is empty: send a JSON object."
  ) {
    fail(`unexpected refusal message: ${outcome.message.slice(0, 160)}`);
  }
  await assertSlicedAgrees(bytes, outcome, slice);
}

const INT32 = { min: -(2n ** 31n), max: 2n ** 31n - 1n };
const INT64 = { min: -(2n ** 63n), max: 2n ** 63n - 1n };

/** The request decoder on number fields: integers exact, fractions and ranges refused as documented. */
function checkDecode(
  field: "max_tokens" | "seed" | "temperature" | "prompt",
  texts: readonly string[],
): void {
  const value = field === "prompt" ? `[${texts.join(",")}]` : (texts[0] as string);
  const body =
    field === "prompt" ? `{"model":"m","prompt":${value}}` : `{"model":"m","prompt":"x","${field}":${value}}`;
  const range = field === "seed" ? INT64 : INT32;
  const rangeMessage = `Invalid value for '${field}': expected an integer from ${range.min} to ${range.max} (${field === "seed" ? "int64" : "int32"}).`;
  let expected: { error: string } | { value: unknown };
  if (field === "temperature") {
    const double = Number(value);
    expected = Number.isFinite(double)
      ? { value: double }
      : { error: "Invalid value for 'temperature': the number is too large." };
  } else if (field === "prompt") {
    const readings = texts.map(referenceExactInteger);
    if (texts.length === 0) {
      expected = { value: [] };
    } else if (readings.some((r) => r.kind === "fraction")) {
      expected = {
        error:
          "Invalid type for 'prompt': expected a string, an array of strings, an array of integers, or an array of arrays of integers.",
      };
    } else {
      const outside = readings.find(
        (r) => r.kind !== "integer" || r.value < INT32.min || r.value > INT32.max,
      );
      expected =
        outside !== undefined
          ? { error: rangeMessage }
          : { value: readings.map((r) => Number((r as { value: bigint }).value)) };
    }
  } else {
    const reading = referenceExactInteger(value);
    if (reading.kind === "fraction")
      expected = { error: `Invalid type for '${field}': expected an integer.` };
    else if (reading.kind === "huge" || reading.value < range.min || reading.value > range.max)
      expected = { error: rangeMessage };
    else expected = { value: field === "seed" ? reading.value : Number(reading.value) };
  }
  let got: { error: string } | { value: unknown };
  try {
    const { request } = decodeCompletionRequest(body);
    const fromRequest = {
      max_tokens: request.maxTokens,
      seed: request.seed,
      temperature: request.temperature,
      prompt:
        request.prompt.case === "tokenIds"
          ? request.prompt.value.values
          : request.prompt.case === "texts"
            ? request.prompt.value.values
            : undefined,
    }[field];
    got = { value: fromRequest };
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    if (err.status !== 400 || err.param !== field) fail(`refusal of ${field} with param ${err.param}`);
    got = { error: err.message };
  }
  const show = (x: unknown) =>
    JSON.stringify(x, (_, v) => (typeof v === "bigint" ? `${v}n` : v))?.slice(0, 200);
  const same =
    "error" in expected
      ? "error" in got && got.error === expected.error
      : "value" in got &&
        (Array.isArray(expected.value)
          ? Array.isArray(got.value) &&
            got.value.length === expected.value.length &&
            got.value.every((x, i) => x === (expected as { value: unknown[] }).value[i])
          : got.value === expected.value);
  if (!same) fail(`${field} ${show(texts)}: expected ${show(expected)}, got ${show(got)}`);
}

/** One case of the property: a document, a corrupted body, or number fields of a request. */
export type Scenario =
  | { kind: "document"; doc: Doc; spaces: string[]; slice: number }
  | { kind: "corrupted"; doc: Doc; spaces: string[]; mutation: Mutation; slice: number }
  | { kind: "decode"; field: "max_tokens" | "seed" | "temperature" | "prompt"; texts: string[] };

/** The property's inputs. */
export const scenario: fc.Arbitrary<Scenario> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant("document" as const),
      doc: anyDoc,
      spaces: whitespace,
      slice: fc.integer({ min: 1, max: 4096 }),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("corrupted" as const),
      doc: shallowDoc,
      spaces: whitespace,
      mutation,
      slice: fc.integer({ min: 1, max: 64 }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant("decode" as const),
      field: fc.constantFrom(
        "max_tokens" as const,
        "seed" as const,
        "temperature" as const,
        "prompt" as const,
      ),
      texts: fc.array(fc.oneof(numberText, fc.integer({ min: 0, max: 128_000 }).map(String)), {
        minLength: 1,
        maxLength: 50,
      }),
    }),
  },
);

/** Checks one scenario against the references; throws on a disagreement. */
export async function checkScenario(s: Scenario): Promise<void> {
  if (s.kind === "document") await checkDocument(s.doc, s.spaces, s.slice);
  else if (s.kind === "corrupted") await checkCorrupted(s.doc, s.spaces, s.mutation, s.slice);
  else checkDecode(s.field, s.field === "prompt" ? s.texts : s.texts.slice(0, 1));
}

/** The property: every scenario agrees with the references. */
export const strictJsonProperty = fc.asyncProperty(scenario, checkScenario);
