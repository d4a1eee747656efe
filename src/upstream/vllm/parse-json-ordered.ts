// JSON.parse reorders integer-like keys ("123" before " the"), but vLLM's logprob dicts are
// ordered (prompt_logprobs: keyed by token id; top_logprobs: keyed by decoded token, which can be
// "1"). This parser builds the same values as JSON.parse and remembers the source order of keys
// for objects whose order JSON.parse would lose.

const KEY_ORDER: unique symbol = Symbol("acs.keyOrder");

const INDEX_KEY = /^(?:0|[1-9][0-9]{0,9})$/;
/** A backslash or a control character (which JSON.parse refuses) inside a string. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: finding raw control characters is the point.
const NEEDS_DECODE = /[\\\u0000-\u001f]/;
const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

/**
 * The entries of a parsed object in source order (for objects from {@link parseJsonOrdered});
 * otherwise `Object.entries` order.
 */
export function orderedEntries<T>(obj: Readonly<Record<string, T>>): [string, T][] {
  const order = (obj as { [KEY_ORDER]?: string[] })[KEY_ORDER];
  if (order === undefined) return Object.entries(obj);
  return order.map((k) => [k, obj[k] as T]);
}

/** The parser's state: the text and the position of the next character to read. */
interface Cursor {
  readonly text: string;
  i: number;
}

/**
 * Parses JSON text like JSON.parse (same values; `__proto__` becomes an own property) and keeps
 * the source order of keys where JSON.parse would lose it, for {@link orderedEntries}. A repeated
 * key keeps its last value at its first position. Throws SyntaxError for invalid JSON.
 */
export function parseJsonOrdered(text: string): unknown {
  const c: Cursor = { text, i: 0 };
  const result = readValue(c);
  skipSpace(c);
  if (c.i < text.length) fail(c, "Unexpected data after JSON");
  return result;
}

/** Throws the SyntaxError of `what` at the cursor's position. */
function fail(c: Cursor, what: string): never {
  throw new SyntaxError(`${what} at position ${c.i} of JSON`);
}

/** Moves past JSON's whitespace (space, LF, CR, tab). */
function skipSpace(c: Cursor): void {
  const { text } = c;
  const n = text.length;
  while (c.i < n) {
    const code = text.charCodeAt(c.i);
    if (code === 0x20 || code === 0x0a || code === 0x0d || code === 0x09) c.i++;
    else break;
  }
}

/** One value, after any whitespace. */
function readValue(c: Cursor): unknown {
  skipSpace(c);
  switch (c.text[c.i]) {
    case "{":
      return readObject(c);
    case "[":
      return readArray(c);
    case '"':
      return readString(c);
    case "t":
      return readLiteral(c, "true", true);
    case "f":
      return readLiteral(c, "false", false);
    case "n":
      return readLiteral(c, "null", null);
    default:
      return readNumber(c);
  }
}

/** A string; the cursor is at its opening quote. */
function readString(c: Cursor): string {
  const { text } = c;
  const start = c.i;
  let j = start + 1;
  for (;;) {
    const q = text.indexOf('"', j);
    if (q < 0) fail(c, "Unterminated string");
    let backslashes = 0;
    for (let k = q - 1; k > start && text.charCodeAt(k) === 0x5c; k--) backslashes++;
    if (backslashes % 2 === 0) {
      c.i = q + 1;
      const raw = text.slice(start + 1, q);
      // Escapes or control characters: let the native parser decode (and check) this string.
      return NEEDS_DECODE.test(raw) ? (JSON.parse(text.slice(start, q + 1)) as string) : raw;
    }
    j = q + 1;
  }
}

/** `true`, `false` or `null`: `word`, read as `value`. */
function readLiteral(c: Cursor, word: string, value: unknown): unknown {
  if (c.text.startsWith(word, c.i)) {
    c.i += word.length;
    return value;
  }
  return fail(c, "Unexpected token");
}

/** A number, or the error of a token that is no value. */
function readNumber(c: Cursor): number {
  NUMBER.lastIndex = c.i;
  if (!NUMBER.test(c.text)) return fail(c, "Unexpected token");
  const start = c.i;
  c.i = NUMBER.lastIndex;
  return Number(c.text.slice(start, c.i));
}

/** An array; the cursor is at its `[`. */
function readArray(c: Cursor): unknown[] {
  c.i++;
  const out: unknown[] = [];
  skipSpace(c);
  if (c.text[c.i] === "]") {
    c.i++;
    return out;
  }
  for (;;) {
    out.push(readValue(c));
    skipSpace(c);
    const next = c.text[c.i++];
    if (next === "]") return out;
    if (next !== ",") fail(c, "Expected ',' or ']'");
  }
}

/** An object, its keys' source order attached when one is integer-like; the cursor is at its `{`. */
function readObject(c: Cursor): Record<string, unknown> {
  c.i++;
  const out: Record<string, unknown> = {};
  const keys: string[] = [];
  let reordered = false;
  skipSpace(c);
  if (c.text[c.i] === "}") {
    c.i++;
    return out;
  }
  for (;;) {
    skipSpace(c);
    if (c.text[c.i] !== '"') fail(c, "Expected a key");
    const key = readString(c);
    skipSpace(c);
    if (c.text[c.i++] !== ":") fail(c, "Expected ':'");
    const v = readValue(c);
    if (!Object.hasOwn(out, key)) {
      keys.push(key);
      if (INDEX_KEY.test(key)) reordered = true;
    }
    setOwn(out, key, v);
    skipSpace(c);
    const next = c.text[c.i++];
    if (next === "}") break;
    if (next !== ",") fail(c, "Expected ',' or '}'");
  }
  if (reordered) Object.defineProperty(out, KEY_ORDER, { value: keys, enumerable: false });
  return out;
}

/** `out[key] = v`, except that `__proto__` becomes an own property (as with JSON.parse). */
function setOwn(out: Record<string, unknown>, key: string, v: unknown): void {
  if (key === "__proto__") {
    Object.defineProperty(out, key, { value: v, enumerable: true, writable: true, configurable: true });
  } else {
    out[key] = v;
  }
}
