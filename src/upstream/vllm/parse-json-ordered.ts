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

/**
 * Parses JSON text like JSON.parse (same values; `__proto__` becomes an own property) and keeps
 * the source order of keys where JSON.parse would lose it, for {@link orderedEntries}. A repeated
 * key keeps its last value at its first position. Throws SyntaxError for invalid JSON.
 */
export function parseJsonOrdered(text: string): unknown {
  let i = 0;
  const n = text.length;

  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at position ${i} of JSON`);
  };
  const ws = (): void => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else break;
    }
  };
  const string = (): string => {
    // text[i] is the opening quote.
    const start = i;
    let j = i + 1;
    for (;;) {
      const q = text.indexOf('"', j);
      if (q < 0) fail("Unterminated string");
      let backslashes = 0;
      for (let k = q - 1; k > start && text.charCodeAt(k) === 0x5c; k--) backslashes++;
      if (backslashes % 2 === 0) {
        i = q + 1;
        const raw = text.slice(start + 1, q);
        // Escapes or control characters: let the native parser decode (and check) this string.
        return NEEDS_DECODE.test(raw) ? (JSON.parse(text.slice(start, q + 1)) as string) : raw;
      }
      j = q + 1;
    }
  };
  const literal = (word: string, value: unknown): unknown => {
    if (text.startsWith(word, i)) {
      i += word.length;
      return value;
    }
    return fail("Unexpected token");
  };
  const value = (): unknown => {
    ws();
    const c = text[i];
    switch (c) {
      case "{":
        return object();
      case "[":
        return array();
      case '"':
        return string();
      case "t":
        return literal("true", true);
      case "f":
        return literal("false", false);
      case "n":
        return literal("null", null);
      default: {
        NUMBER.lastIndex = i;
        if (!NUMBER.test(text)) return fail("Unexpected token");
        const start = i;
        i = NUMBER.lastIndex;
        return Number(text.slice(start, i));
      }
    }
  };
  const array = (): unknown[] => {
    i++;
    const out: unknown[] = [];
    ws();
    if (text[i] === "]") {
      i++;
      return out;
    }
    for (;;) {
      out.push(value());
      ws();
      const c = text[i++];
      if (c === "]") return out;
      if (c !== ",") fail("Expected ',' or ']'");
    }
  };
  const object = (): Record<string, unknown> => {
    i++;
    const out: Record<string, unknown> = {};
    const keys: string[] = [];
    let reordered = false;
    ws();
    if (text[i] === "}") {
      i++;
      return out;
    }
    for (;;) {
      ws();
      if (text[i] !== '"') fail("Expected a key");
      const key = string();
      ws();
      if (text[i++] !== ":") fail("Expected ':'");
      const v = value();
      if (!Object.hasOwn(out, key)) {
        keys.push(key);
        if (INDEX_KEY.test(key)) reordered = true;
      }
      if (key === "__proto__") {
        Object.defineProperty(out, key, { value: v, enumerable: true, writable: true, configurable: true });
      } else {
        out[key] = v;
      }
      ws();
      const c = text[i++];
      if (c === "}") break;
      if (c !== ",") fail("Expected ',' or '}'");
    }
    if (reordered) Object.defineProperty(out, KEY_ORDER, { value: keys, enumerable: false });
    return out;
  };

  const result = value();
  ws();
  if (i < n) fail("Unexpected data after JSON");
  return result;
}
