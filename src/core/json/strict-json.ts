// Strict JSON for request bodies: a single-pass parser over the body's bytes that keeps every
// number's exact value, refuses duplicate keys with different values, never lets a key reach a
// prototype, and costs time linear in the body (no regular expression ever sees caller text).
import { isAscii, isUtf8 } from "node:buffer";
import { setImmediate as yieldToEventLoop } from "node:timers/promises";
import { clip, invalidRequest } from "../errors/index.js";

/**
 * A JSON number kept as its source text, because its nearest double could mislead a reader: an
 * integer beyond ±(2^53 − 1) (`9223372036854775807`, `1e20`), a non-integer whose double is an
 * integer (`1.0000000000000000001`, `1e-400`), or a double that overflows (`1e400`). Every other
 * number is a plain JS number (see {@link parseStrictJson}).
 */
export class JsonNumberText {
  /** The number exactly as written in the body (JSON number grammar, ASCII). */
  readonly text: string;
  constructor(text: string) {
    this.text = text;
  }
}

/** A JSON number as {@link parseStrictJson} gives it: a plain number, or its source text. */
export type JsonNumber = number | JsonNumberText;

/** Whether `value` is a JSON number of a {@link parseStrictJson} result. */
export function isJsonNumber(value: unknown): value is JsonNumber {
  return typeof value === "number" || value instanceof JsonNumberText;
}

/** The double nearest to a JSON number (what JSON.parse gives): ±Infinity when it overflows. */
export function jsonNumberToDouble(value: JsonNumber): number {
  return typeof value === "number" ? value : Number(value.text);
}

/**
 * A JSON object of a {@link parseStrictJson} result: an ordinary object whose keys are all own
 * properties (a `__proto__` key included: it is defined, never assigned).
 */
export type JsonObject = Record<string, unknown>;

/** Deepest nesting of arrays and objects a body may have. */
export const MAX_JSON_DEPTH = 512;

/**
 * A bound on the items of one array of a body, checked while the body is parsed: once the array
 * at `path` (object keys from the top, each container on the way an object) holds more than
 * `maxItems` items and its first item is a string or an array, `refuse()` is thrown at once, and
 * the rest of the body is never read. (Numbers are not counted: an array of numbers there is one
 * token-id prompt, not a list of prompts.)
 */
export interface JsonArrayCap {
  readonly path: readonly string[];
  readonly maxItems: number;
  readonly refuse: () => Error;
}

/** Bytes parsed between two yields to the event loop by {@link parseStrictJsonAsync}. */
export const JSON_SLICE_BYTES = 256 * 1024;

const SPACE = 0x20;
const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const SLASH = 0x2f;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const MINUS = 0x2d;
const PLUS = 0x2b;
const DOT = 0x2e;
const ZERO = 0x30;
const NINE = 0x39;
const LOWER_E = 0x65;
const UPPER_E = 0x45;

/** 10^0 … 10^22, each read from its decimal literal: every one is exact as a double. */
const POW10 = Array.from({ length: 23 }, (_, k) => Number(`1e${k}`));

/** A JSON syntax error at a byte offset; becomes the 400 of {@link parseStrictJson}. */
class JsonSyntaxError extends Error {}

/** End offset of the last token read by {@link scanString} / {@link scanNumber}. */
let scanEnd = 0;

/**
 * The parser whose {@link StrictJsonParser.run} is running (a run never yields, so parses in
 * slices cannot mix it up); undefined between runs, so that no body stays referenced.
 */
let running: StrictJsonParser | undefined;

/** The text of the body's bytes [from, end): a slice of its ASCII text when it has one. */
function textOf(bytes: Buffer, from: number, end: number): string {
  const ascii = running?.asciiText();
  return ascii === undefined ? bytes.toString("latin1", from, end) : ascii.slice(from, end);
}

function describeAt(bytes: Buffer, at: number): string {
  if (at >= bytes.length) return "the end of the body";
  const byte = bytes[at] as number;
  if (byte >= 0x20 && byte < 0x7f) return `'${String.fromCharCode(byte)}' at position ${at}`;
  const char = bytes.toString("utf8", at, Math.min(at + 4, bytes.length)).codePointAt(0) ?? byte;
  return `U+${char.toString(16).toUpperCase().padStart(4, "0")} at position ${at}`;
}

function unexpected(bytes: Buffer, at: number, expected: string): JsonSyntaxError {
  return new JsonSyntaxError(`expected ${expected} but found ${describeAt(bytes, at)}`);
}

function hexValue(byte: number | undefined): number {
  if (byte === undefined) return -1;
  if (byte >= 0x30 && byte <= 0x39) return byte - 0x30;
  const lower = byte | 0x20;
  if (lower >= 0x61 && lower <= 0x66) return lower - 0x61 + 10;
  return -1;
}

/** The string whose opening quote is at `start`; sets scanEnd past its closing quote. */
function scanString(bytes: Buffer, start: number): string {
  const n = bytes.length;
  let i = start + 1;
  let ascii = true;
  for (;;) {
    if (i >= n) throw new JsonSyntaxError(`the string that starts at position ${start} never ends`);
    const byte = bytes[i] as number;
    if (byte === QUOTE) {
      scanEnd = i + 1;
      return bytes.toString(ascii ? "latin1" : "utf8", start + 1, i);
    }
    if (byte === BACKSLASH) return scanEscapedString(bytes, start);
    if (byte < 0x20) throw unexpected(bytes, i, "a character of a string (control characters are escaped)");
    if (byte >= 0x80) ascii = false;
    i++;
  }
}

/** Scratch for {@link scanEscapedString}: UTF-16LE code units; a bigger one is never kept. */
const SCRATCH_BYTES = 64 * 1024;
let scratch = Buffer.allocUnsafe(SCRATCH_BYTES);

/** The escape character of `\b`, `\f`, `\n`, `\r`, `\t`, `\"`, `\\`, `\/` → its code unit; else -1. */
function simpleEscape(byte: number | undefined): number {
  switch (byte) {
    case QUOTE:
      return QUOTE;
    case BACKSLASH:
      return BACKSLASH;
    case SLASH:
      return SLASH;
    case 0x62:
      return 0x08;
    case 0x66:
      return 0x0c;
    case 0x6e:
      return LF;
    case 0x72:
      return CR;
    case 0x74:
      return TAB;
    default:
      return -1;
  }
}

/** The refusal of the surrogate escape at `at` with no other half beside it. */
const loneSurrogate = (bytes: Buffer, at: number): JsonSyntaxError =>
  new JsonSyntaxError(
    `the escape ${bytes.toString("latin1", at, at + 6)} at position ${at} is a lone surrogate: a string holds Unicode characters only`,
  );

/**
 * A string with escapes (its opening quote at `start`), decoded in one pass into UTF-16 code
 * units (the body is valid UTF-8, checked before), then made a string at once. A surrogate escape
 * must be half of a pair (`\ud83d\ude00`): a lone one (`\ud800`) is refused, unlike JSON.parse —
 * a string holds Unicode characters only (RFC 8259 §8.2; I-JSON, RFC 7493 §2.1), as a protobuf
 * string must, so that REST and Connect JSON refuse the same text alike.
 */
function scanEscapedString(bytes: Buffer, start: number): string {
  const n = bytes.length;
  let out = scratch;
  let length = 0; // bytes of `out` used (two per code unit)
  const put = (unit: number): void => {
    if (length + 2 > out.length) {
      const bigger = Buffer.allocUnsafe(out.length * 2);
      out.copy(bigger, 0, 0, length);
      out = bigger;
    }
    out[length] = unit & 0xff;
    out[length + 1] = unit >>> 8;
    length += 2;
  };
  let i = start + 1;
  /** The position of a high surrogate's escape whose low half must come next; -1 when none. */
  let high = -1;
  for (;;) {
    if (i >= n) throw new JsonSyntaxError(`the string that starts at position ${start} never ends`);
    const byte = bytes[i] as number;
    if (high >= 0 && (byte !== BACKSLASH || bytes[i + 1] !== 0x75)) throw loneSurrogate(bytes, high);
    if (byte === QUOTE) break;
    if (byte === BACKSLASH) {
      const escaped = bytes[i + 1];
      const unit = simpleEscape(escaped);
      if (unit >= 0) {
        put(unit);
        i += 2;
        continue;
      }
      if (escaped !== 0x75) {
        throw unexpected(bytes, i + 1, 'an escape (\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)');
      }
      const code =
        (hexValue(bytes[i + 2]) << 12) |
        (hexValue(bytes[i + 3]) << 8) |
        (hexValue(bytes[i + 4]) << 4) |
        hexValue(bytes[i + 5]);
      if (code < 0) throw unexpected(bytes, i, "four hexadecimal digits after \\u");
      const low = code >= 0xdc00 && code <= 0xdfff;
      if (high >= 0 ? !low : low) throw loneSurrogate(bytes, high >= 0 ? high : i);
      high = !low && code >= 0xd800 && code <= 0xdbff ? i : -1;
      put(code);
      i += 6;
    } else if (byte < 0x20) {
      throw unexpected(bytes, i, "a character of a string (control characters are escaped)");
    } else if (byte < 0x80) {
      put(byte);
      i++;
    } else if (byte < 0xe0) {
      put(((byte & 0x1f) << 6) | ((bytes[i + 1] as number) & 0x3f));
      i += 2;
    } else if (byte < 0xf0) {
      put(
        ((byte & 0x0f) << 12) | (((bytes[i + 1] as number) & 0x3f) << 6) | ((bytes[i + 2] as number) & 0x3f),
      );
      i += 3;
    } else {
      const point =
        (((byte & 0x07) << 18) |
          (((bytes[i + 1] as number) & 0x3f) << 12) |
          (((bytes[i + 2] as number) & 0x3f) << 6) |
          ((bytes[i + 3] as number) & 0x3f)) -
        0x10000;
      put(0xd800 | (point >>> 10));
      put(0xdc00 | (point & 0x3ff));
      i += 4;
    }
  }
  scanEnd = i + 1;
  const text = out.toString("utf16le", 0, length);
  if (out.length > SCRATCH_BYTES) out = Buffer.allocUnsafe(SCRATCH_BYTES);
  scratch = out;
  return text;
}

/** Where {@link scanNumberInto} leaves a plain number (a typed array: no boxing per number). */
const numberSlot = new Float64Array(1);

/**
 * The number that starts at `start` (JSON grammar); sets scanEnd past it. A plain number when the
 * double is exact enough for every reader (see {@link parseStrictJson}), left in numberSlot[0]
 * (returns undefined); else its text.
 */
function scanNumberInto(bytes: Buffer, start: number): JsonNumberText | undefined {
  let i = start;
  let byte = bytes[i];
  const negative = byte === MINUS;
  if (negative) byte = bytes[++i];
  // The digits of the integer part and the fraction, from the first non-zero one, as an integer
  // (exact while there are at most 15 of them).
  let mantissa = 0;
  let digits = 0;
  let fractionDigits = 0;
  if (byte === ZERO) {
    byte = bytes[++i];
  } else if (byte !== undefined && byte > ZERO && byte <= NINE) {
    do {
      mantissa = mantissa * 10 + (byte - ZERO);
      digits++;
      byte = bytes[++i];
    } while (byte !== undefined && byte >= ZERO && byte <= NINE);
  } else {
    throw unexpected(bytes, i, "a digit");
  }
  if (byte === DOT) {
    byte = bytes[++i];
    if (byte === undefined || byte < ZERO || byte > NINE) throw unexpected(bytes, i, "a digit after '.'");
    do {
      if (digits > 0 || byte !== ZERO) {
        mantissa = mantissa * 10 + (byte - ZERO);
        digits++;
      }
      fractionDigits++;
      byte = bytes[++i];
    } while (byte !== undefined && byte >= ZERO && byte <= NINE);
  }
  const mantissaEnd = i;
  let exponent = 0;
  let hugeExponent = false;
  if (byte === LOWER_E || byte === UPPER_E) {
    byte = bytes[++i];
    const negativeExponent = byte === MINUS;
    if (byte === MINUS || byte === PLUS) byte = bytes[++i];
    if (byte === undefined || byte < ZERO || byte > NINE) {
      throw unexpected(bytes, i, "a digit in the exponent");
    }
    do {
      if (exponent < 1e9) exponent = exponent * 10 + (byte - ZERO);
      else hugeExponent = true;
      byte = bytes[++i];
    } while (byte !== undefined && byte >= ZERO && byte <= NINE);
    if (negativeExponent) exponent = -exponent;
  }
  scanEnd = i;
  if (mantissa === 0) {
    numberSlot[0] = negative ? -0 : 0;
    return undefined;
  }
  if (hugeExponent) return new JsonNumberText(bytes.toString("latin1", start, i));
  const scale = exponent - fractionDigits;
  if (digits > 15) return scanLongNumber(bytes, start, mantissaEnd, i, digits, scale, negative);
  // The value is exactly mantissa × 10^scale, with mantissa < 10^15 < 2^53, both exact doubles.
  let value: number;
  if (scale === 0) {
    value = mantissa;
  } else if (scale < 0 && scale >= -22) {
    value = mantissa / (POW10[-scale] as number);
  } else if (scale > 0 && scale <= 22) {
    value = mantissa * (POW10[scale] as number);
  } else {
    return scanLongNumber(bytes, start, mantissaEnd, i, digits, scale, negative);
  }
  // One correctly rounded operation on exact operands: the nearest double. With at most 15
  // digits and a power of ten within ±22, an integer result is the value exactly when it is a
  // safe integer, and a non-integer value never rounds to an integer.
  if (Number.isInteger(value) && !Number.isSafeInteger(value)) {
    return new JsonNumberText(bytes.toString("latin1", start, i));
  }
  numberSlot[0] = negative ? -value : value;
  return undefined;
}

/**
 * The end of {@link scanNumberInto} for the numbers its fast path does not take: more than 15
 * digits from the first non-zero one (as Python writes float32 values: `0.10000000149011612`),
 * or a power of ten beyond ±22. The value is exactly D × 10^scale (D: the `digits` digits);
 * whether it is an integer is read from D's trailing zeros, never from the double. A plain number
 * when the double cannot mislead a reader: an integer that is a safe integer (then exact), or a
 * non-integer whose double is finite and not an integer; else the text.
 */
function scanLongNumber(
  bytes: Buffer,
  start: number,
  mantissaEnd: number,
  end: number,
  digits: number,
  scale: number,
  negative: boolean,
): JsonNumberText | undefined {
  let trailingZeros = 0;
  for (let k = mantissaEnd - 1; k > start; k--) {
    const byte = bytes[k];
    if (byte === DOT) continue;
    if (byte !== ZERO) break;
    trailingZeros++;
  }
  const integral = trailingZeros + scale >= 0;
  // An integer of 17 digits or more is beyond 2^53: no need to read it.
  if (integral && digits + scale > 16) return new JsonNumberText(bytes.toString("latin1", start, end));
  const value = Number(textOf(bytes, negative ? start + 1 : start, end));
  if (integral ? !Number.isSafeInteger(value) : Number.isInteger(value) || !Number.isFinite(value)) {
    return new JsonNumberText(bytes.toString("latin1", start, end));
  }
  numberSlot[0] = negative ? -value : value;
  return undefined;
}

/** {@link scanNumberInto} as a value. */
function scanNumber(bytes: Buffer, start: number): JsonNumber {
  return scanNumberInto(bytes, start) ?? (numberSlot[0] as number);
}

/**
 * Numbers of an array, from the one at `start` on, pushed onto `array`: the hot loop of number
 * arrays (steering vectors, token ids). Returns true after the array's closing ']' (scanEnd past
 * it); false at the start of an item that is not a number, or of any item at or after `limit`
 * (scanEnd there), for the general loop to go on from.
 */
function scanNumberRun(bytes: Buffer, start: number, array: unknown[], limit: number): boolean {
  let i = start;
  for (;;) {
    const text = scanNumberInto(bytes, i);
    if (text === undefined) array.push(numberSlot[0]);
    else array.push(text);
    i = scanEnd;
    let byte = bytes[i];
    while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
    if (byte === CLOSE_BRACKET) {
      scanEnd = i + 1;
      return true;
    }
    if (byte !== COMMA) throw unexpected(bytes, i, "',' or ']' after an array item");
    byte = bytes[++i];
    while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
    if (i >= limit || !(byte === MINUS || (byte !== undefined && byte >= ZERO && byte <= NINE))) {
      scanEnd = i;
      return false;
    }
  }
}

/**
 * Whether two parsed JSON values are the same value: numbers by Object.is (`1` and `1.0` are the
 * same, `0` and `-0` are not) or the same text, objects by the same keys in any order.
 */
function sameJsonValue(a: unknown, b: unknown): boolean {
  if (Object.is(a, b)) return true;
  if (a instanceof JsonNumberText) return b instanceof JsonNumberText && a.text === b.text;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let k = 0; k < a.length; k++) if (!sameJsonValue(a[k], b[k])) return false;
    return true;
  }
  if (typeof a !== "object" || a === null || typeof b !== "object" || b === null) return false;
  if (Array.isArray(b) || b instanceof JsonNumberText) return false;
  const left = a as JsonObject;
  const right = b as JsonObject;
  const keys = Object.keys(left);
  if (keys.length !== Object.keys(right).length) return false;
  for (const key of keys) {
    if (!Object.hasOwn(right, key) || !sameJsonValue(left[key], right[key])) return false;
  }
  return true;
}

/** Marks an array frame in the key stack (object frames hold their current key). */
const ARRAY_FRAME = Symbol("array");

/** The key whose opening quote is at `at`, then ':'; sets scanEnd past the colon. */
function scanKey(bytes: Buffer, at: number): string {
  if (bytes[at] !== QUOTE) throw unexpected(bytes, at, "a key in double quotes");
  const key = scanString(bytes, at);
  let i = scanEnd;
  let byte = bytes[i];
  while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
  if (byte !== COLON) throw unexpected(bytes, i, "':' after a key");
  scanEnd = i + 1;
  return key;
}

/**
 * A parse in progress: an explicit stack (no recursion, so depth costs no native stack), resumable
 * at any value boundary, so that {@link parseStrictJsonAsync} can yield between slices.
 */
class StrictJsonParser {
  private readonly bytes: Buffer;
  private position = 0;
  /** The open arrays and objects, outermost first. */
  private readonly containers: (unknown[] | JsonObject)[] = [];
  /** Per open container: ARRAY_FRAME, or the object's key whose value is being read. */
  private readonly keys: (string | typeof ARRAY_FRAME)[] = [];
  private result: unknown;
  /** The body as text when it is all ASCII (null: it is not; undefined: not looked at yet). */
  private text: string | null | undefined;
  private readonly caps: readonly JsonArrayCap[];
  /** The open array one of {@link caps} bounds, and that cap (at most one: paths are fixed). */
  private capped: unknown[] | undefined;
  private cap: JsonArrayCap | undefined;
  /** Whether a key was repeated (with the same value, kept once): the body's text has it twice. */
  repeatedKey = false;

  constructor(bytes: Buffer, caps: readonly JsonArrayCap[]) {
    this.bytes = bytes;
    this.caps = caps;
  }

  /** A new array at the current depth: watched when a cap's path leads to it. */
  private openArray(): unknown[] {
    const array: unknown[] = [];
    const keys = this.keys;
    for (const cap of this.caps) {
      if (cap.path.length === keys.length && cap.path.every((key, k) => keys[k] === key)) {
        this.capped = array;
        this.cap = cap;
      }
    }
    return array;
  }

  /** Throws the cap's refusal when the watched array has grown past it. */
  private checkCap(array: unknown[]): void {
    const cap = this.cap as JsonArrayCap;
    const first = array[0];
    if (array.length > cap.maxItems && (typeof first === "string" || Array.isArray(first)))
      throw cap.refuse();
  }

  /**
   * The whole body as one string when it is all ASCII (offsets in bytes and characters agree),
   * made at the first call: long numbers are read from slices of it (`Number(slice)`) instead of
   * a copy of their bytes each. Never handed out: parsed strings are always fresh.
   */
  asciiText(): string | undefined {
    if (this.text === undefined) this.text = isAscii(this.bytes) ? this.bytes.toString("latin1") : null;
    return this.text ?? undefined;
  }

  /** The parsed value (after {@link run} returned true). */
  get value(): unknown {
    return this.result;
  }

  /** Byte offset reached. */
  get offset(): number {
    return this.position;
  }

  /**
   * Parses on from the current offset; stops at the first value boundary at or after byte
   * `limit`. Returns true when the whole body is parsed.
   *
   * @throws JsonSyntaxError
   */
  run(limit: number): boolean {
    running = this;
    try {
      return this.runFrom(this.position, limit);
    } finally {
      running = undefined;
    }
  }

  private runFrom(start: number, limit: number): boolean {
    const bytes = this.bytes;
    const n = bytes.length;
    const containers = this.containers;
    const keys = this.keys;
    let i = start;
    let value: unknown;
    for (;;) {
      // A value starts at i (after whitespace).
      if (i >= limit && containers.length > 0) {
        this.position = i;
        return false;
      }
      let byte = bytes[i];
      while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
      if (byte === MINUS || (byte !== undefined && byte >= ZERO && byte <= NINE)) {
        const depth = containers.length;
        if (depth > 0 && keys[depth - 1] === ARRAY_FRAME) {
          const closed = scanNumberRun(bytes, i, containers[depth - 1] as unknown[], limit);
          i = scanEnd;
          if (!closed) continue;
          keys.pop();
          value = containers.pop();
        } else {
          value = scanNumber(bytes, i);
          i = scanEnd;
        }
      } else if (byte === QUOTE) {
        value = scanString(bytes, i);
        i = scanEnd;
      } else if (byte === OPEN_BRACKET) {
        if (containers.length >= MAX_JSON_DEPTH) throw new JsonSyntaxError("it is nested too deeply");
        byte = bytes[++i];
        while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
        if (byte !== CLOSE_BRACKET) {
          containers.push(this.openArray());
          keys.push(ARRAY_FRAME);
          continue;
        }
        i++;
        value = [];
      } else if (byte === OPEN_BRACE) {
        if (containers.length >= MAX_JSON_DEPTH) throw new JsonSyntaxError("it is nested too deeply");
        byte = bytes[++i];
        while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
        if (byte !== CLOSE_BRACE) {
          containers.push({});
          keys.push(scanKey(bytes, i));
          i = scanEnd;
          continue;
        }
        i++;
        value = {};
      } else if (byte === 0x74 && bytes[i + 1] === 0x72 && bytes[i + 2] === 0x75 && bytes[i + 3] === 0x65) {
        value = true;
        i += 4;
      } else if (
        byte === 0x66 &&
        bytes[i + 1] === 0x61 &&
        bytes[i + 2] === 0x6c &&
        bytes[i + 3] === 0x73 &&
        bytes[i + 4] === 0x65
      ) {
        value = false;
        i += 5;
      } else if (byte === 0x6e && bytes[i + 1] === 0x75 && bytes[i + 2] === 0x6c && bytes[i + 3] === 0x6c) {
        value = null;
        i += 4;
      } else {
        throw unexpected(bytes, i, "a JSON value");
      }
      // A value ends at i: put it in its container, then close every container that ends here.
      for (;;) {
        byte = bytes[i];
        while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
        const depth = containers.length;
        if (depth === 0) {
          if (i < n) throw unexpected(bytes, i, "the end of the body");
          this.position = i;
          this.result = value;
          return true;
        }
        const container = containers[depth - 1] as unknown[] | JsonObject;
        const key = keys[depth - 1] as string | typeof ARRAY_FRAME;
        if (key === ARRAY_FRAME) {
          (container as unknown[]).push(value);
          if (container === this.capped) this.checkCap(container as unknown[]);
          if (byte === COMMA) {
            i++;
            break;
          }
          if (byte !== CLOSE_BRACKET) throw unexpected(bytes, i, "',' or ']' after an array item");
        } else {
          const object = container as JsonObject;
          if (!Object.hasOwn(object, key)) {
            if (key === "__proto__") {
              // Assignment would call Object.prototype's __proto__ setter; define the key instead.
              Object.defineProperty(object, key, {
                value,
                writable: true,
                enumerable: true,
                configurable: true,
              });
            } else {
              object[key] = value;
            }
          } else if (sameJsonValue(object[key], value)) {
            this.repeatedKey = true;
          } else {
            throw new JsonSyntaxError(`repeated key "${clip(key)}" has a different value at position ${i}`);
          }
          if (byte === COMMA) {
            byte = bytes[++i];
            while (byte === SPACE || byte === LF || byte === CR || byte === TAB) byte = bytes[++i];
            keys[depth - 1] = scanKey(bytes, i);
            i = scanEnd;
            break;
          }
          if (byte !== CLOSE_BRACE) throw unexpected(bytes, i, "',' or '}' after an object value");
        }
        i++;
        containers.pop();
        keys.pop();
        value = container;
      }
    }
  }
}

function isJsonWhitespaceOnly(bytes: Buffer): boolean {
  for (let i = 0; i < bytes.length; i++) {
    const byte = bytes[i];
    if (byte !== SPACE && byte !== LF && byte !== CR && byte !== TAB) return false;
  }
  return true;
}

/** The body's bytes, checked as UTF-8 and not empty, and a parser ready to start. */
function startParse(body: string | Uint8Array, caps: readonly JsonArrayCap[]): StrictJsonParser {
  const bytes =
    typeof body === "string"
      ? Buffer.from(body, "utf8")
      : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (!isUtf8(bytes)) {
    throw invalidRequest(null, "The request body is not valid JSON: it is not valid UTF-8 text.");
  }
  if (isJsonWhitespaceOnly(bytes)) {
    throw invalidRequest(null, "The request body is empty: send a JSON object.");
  }
  if (bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) {
    throw invalidRequest(
      null,
      "The request body is not valid JSON: it starts with a byte order mark (U+FEFF), which JSON does not allow.",
    );
  }
  return new StrictJsonParser(bytes, caps);
}

function syntaxError(err: unknown): unknown {
  if (!(err instanceof JsonSyntaxError)) return err;
  return invalidRequest(null, `The request body is not valid JSON: ${err.message}.`);
}

/**
 * Parses a request body as strict JSON (RFC 8259), in one pass over its bytes, in time linear in
 * its length.
 *
 * - The bytes must be UTF-8 (invalid sequences are refused, never replaced by U+FFFD); a leading
 *   byte order mark is refused. A string argument is encoded as UTF-8 first.
 * - Objects are ordinary objects (as small as JSON.parse's) whose keys are all own properties: a
 *   `__proto__` key is defined, never assigned, so it cannot change a prototype (`constructor`
 *   and `prototype` are plain keys too); the strict decoder then refuses them as unknown fields.
 * - A key repeated with the same value is kept once; with a different value it is refused
 *   (JSON.parse would silently keep the last one).
 * - Numbers: a plain JS number when its nearest double (what JSON.parse gives) cannot mislead a
 *   reader: an integer that is a safe integer (then it is the value exactly: `42`, `1.0`, `1e3`),
 *   or a non-integer whose double is not an integer (`0.5`, `-1.25e-3`, `0.10000000149011612`);
 *   whether a number is an integer is decided from its digits, never from the double. Anything
 *   else is a {@link JsonNumberText} holding the source text (`9223372036854775807`, `1e20`,
 *   `1e400`, `1.0000000000000000001`). Read integers with {@link readExactInteger}, decimals with
 *   {@link jsonNumberToDouble}.
 * - At most {@link MAX_JSON_DEPTH} nested arrays and objects.
 * - `caps` bound arrays while they are read (see {@link JsonArrayCap}).
 *
 * Strings are fresh (never slices of the body), so keeping one keeps nothing else alive.
 *
 * @throws ApiError 400 `invalid_request` (param null): invalid UTF-8, a BOM, an empty body,
 *   malformed JSON (the message says what was expected and at which byte offset), a duplicate key
 *   with a different value, nesting deeper than {@link MAX_JSON_DEPTH}; and a cap's refusal, as
 *   soon as the capped array passes it (whatever follows in the body).
 */
export function parseStrictJson(body: string | Uint8Array, caps: readonly JsonArrayCap[] = []): unknown {
  return parseStrictJsonNoting(body, caps).value;
}

/**
 * {@link parseStrictJson}, and whether the body repeated a key (with the same value, which the value
 * keeps once): a reader of the body's text (protobuf-es refuses every repeated key) must then be
 * given the value written out again. Throws as {@link parseStrictJson}.
 */
export function parseStrictJsonNoting(
  body: string | Uint8Array,
  caps: readonly JsonArrayCap[] = [],
): { readonly value: unknown; readonly repeatedKey: boolean } {
  const parser = startParse(body, caps);
  try {
    parser.run(Number.POSITIVE_INFINITY);
  } catch (err) {
    throw syntaxError(err);
  }
  return { value: parser.value, repeatedKey: parser.repeatedKey };
}

/**
 * {@link parseStrictJson} for big bodies: the same parse, in slices of about `sliceBytes` bytes,
 * yielding to the event loop (`setImmediate`) between slices, so that other requests are served
 * while a max-size body is parsed. A body of at most one slice is parsed without yielding.
 */
export async function parseStrictJsonAsync(
  body: Uint8Array,
  sliceBytes: number = JSON_SLICE_BYTES,
  caps: readonly JsonArrayCap[] = [],
): Promise<unknown> {
  const parser = startParse(body, caps);
  try {
    while (!parser.run(parser.offset + sliceBytes)) await yieldToEventLoop();
  } catch (err) {
    throw syntaxError(err);
  }
  return parser.value;
}

/** What an exact reading of a JSON number as an integer gives. */
export type ExactInteger =
  | { readonly kind: "integer"; readonly value: bigint }
  /** The number has a non-zero fractional part (1.5, 1e-3). */
  | { readonly kind: "fraction" }
  /** Integral, but with more than 19 significant digits: beyond every int64. */
  | { readonly kind: "huge" };

const FRACTION: ExactInteger = { kind: "fraction" };
const HUGE: ExactInteger = { kind: "huge" };

function isDigitCode(code: number): boolean {
  return code >= ZERO && code <= NINE;
}

/**
 * Reads the source text of a JSON number (`"12"`, `"-1.0"`, `"1e3"`, `"9223372036854775807"`)
 * exactly, as decimal arithmetic, never through a double. `1.0` and `1e3` are integers; `1.5` is
 * a fraction. One scan of the text: cost is linear in its length (huge exponents are never
 * expanded). Text that is not a JSON number reads as a fraction.
 */
export function readExactIntegerText(text: string): ExactInteger {
  const n = text.length;
  let i = 0;
  const negative = text.charCodeAt(0) === MINUS;
  if (negative) i++;
  // Digits of the integer part and fraction: where the first and last non-zero ones are.
  const digitsStart = i;
  while (i < n && isDigitCode(text.charCodeAt(i))) i++;
  const wholeEnd = i;
  if (wholeEnd === digitsStart) return FRACTION;
  let fractionEnd = wholeEnd;
  if (i < n && text.charCodeAt(i) === DOT) {
    i++;
    while (i < n && isDigitCode(text.charCodeAt(i))) i++;
    fractionEnd = i;
    if (fractionEnd === wholeEnd + 1) return FRACTION;
  }
  let exponent = 0;
  let hugeExponent = false;
  if (i < n && (text.charCodeAt(i) === LOWER_E || text.charCodeAt(i) === UPPER_E)) {
    i++;
    const negativeExponent = text.charCodeAt(i) === MINUS;
    if (negativeExponent || text.charCodeAt(i) === PLUS) i++;
    const exponentStart = i;
    while (i < n && isDigitCode(text.charCodeAt(i))) {
      if (exponent < 1e9) exponent = exponent * 10 + (text.charCodeAt(i) - ZERO);
      else hugeExponent = true;
      i++;
    }
    if (i === exponentStart) return FRACTION;
    if (negativeExponent) exponent = -exponent;
  }
  if (i !== n) return FRACTION;
  // Skip the '.' when walking digits: positions in [digitsStart, fractionEnd) except wholeEnd.
  let first = -1;
  let last = -1;
  for (let k = digitsStart; k < fractionEnd; k++) {
    if (k === wholeEnd) continue;
    if (text.charCodeAt(k) !== ZERO) {
      first = k;
      break;
    }
  }
  if (first === -1) return { kind: "integer", value: 0n };
  for (let k = fractionEnd - 1; k >= first; k--) {
    if (k === wholeEnd) continue;
    if (text.charCodeAt(k) !== ZERO) {
      last = k;
      break;
    }
  }
  // value = D × 10^scale, D = the digits first..last (the '.' skipped), without trailing zeros.
  const fractionDigits = fractionEnd > wholeEnd ? fractionEnd - wholeEnd - 1 : 0;
  const trailingZeros = last < wholeEnd ? wholeEnd - last - 1 + fractionDigits : fractionEnd - last - 1;
  const significant = last - first + 1 - (first < wholeEnd && last > wholeEnd ? 1 : 0);
  if (hugeExponent) return exponent < 0 ? FRACTION : HUGE;
  const scale = exponent - fractionDigits + trailingZeros;
  if (scale < 0) return FRACTION;
  if (significant + scale > 19) return HUGE;
  const digits =
    first < wholeEnd && last > wholeEnd
      ? text.slice(first, wholeEnd) + text.slice(wholeEnd + 1, last + 1)
      : text.slice(first, last + 1);
  const magnitude = BigInt(digits) * 10n ** BigInt(scale);
  return { kind: "integer", value: negative ? -magnitude : magnitude };
}

/**
 * Reads a JSON number of a {@link parseStrictJson} result exactly as an integer: a plain number
 * is a safe integer or not an integer at all (see there); text is read by
 * {@link readExactIntegerText}. Linear in the number's length.
 */
export function readExactInteger(value: JsonNumber): ExactInteger {
  if (typeof value !== "number") return readExactIntegerText(value.text);
  if (!Number.isInteger(value)) return FRACTION;
  return { kind: "integer", value: BigInt(value) };
}
