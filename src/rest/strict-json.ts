import { isLosslessNumber, LosslessNumber, parse } from "lossless-json";
import { clip, invalidRequest } from "../errors/index.js";

/** A JSON number kept as its source text (lossless-json), so int64 values stay exact. */
export { isLosslessNumber as isJsonNumber, LosslessNumber as JsonNumber };

/** Refuses invalid UTF-8 instead of replacing it; keeps a leading BOM (which JSON then refuses). */
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * The raw bytes of a request body as text, strictly: invalid UTF-8 (e.g. `\xff\xfe` inside a
 * string) is refused, never replaced by U+FFFD. A leading BOM is kept, so the JSON parser refuses
 * it as it refuses any other stray character.
 *
 * @throws ApiError 400 `invalid_request` (param null) for bytes that are not UTF-8.
 */
export function decodeUtf8Body(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    throw invalidRequest(null, "The request body is not valid JSON: it is not valid UTF-8 text.");
  }
}

/**
 * Parses a request body as JSON without losing precision: every number becomes a
 * `LosslessNumber` holding its source text. Objects are plain objects; a `__proto__` key becomes
 * an own property (lossless-json defines it, never assigns it), so it cannot change a prototype;
 * the strict decoder then refuses it as an unknown field. A key repeated with a different value is
 * refused (JSON.parse would silently keep the last one).
 *
 * @throws ApiError 400 `invalid_request` (param null) for malformed JSON, an empty body, or nesting
 *   too deep for the parser.
 */
export function parseStrictJson(body: string): unknown {
  if (body.trim() === "") {
    throw invalidRequest(null, "The request body is empty: send a JSON object.");
  }
  try {
    return parse(body);
  } catch (err) {
    if (err instanceof RangeError) {
      throw invalidRequest(null, "The request body is not valid JSON: it is nested too deeply.");
    }
    const detail = err instanceof Error ? err.message : String(err);
    throw invalidRequest(null, `The request body is not valid JSON: ${clip(detail)}.`);
  }
}

/** What an exact reading of a JSON number as an integer gives. */
export type ExactInteger =
  | { readonly kind: "integer"; readonly value: bigint }
  /** The number has a non-zero fractional part (1.5, 1e-3). */
  | { readonly kind: "fraction" }
  /** Integral, but with more than 19 significant digits: beyond every int64. */
  | { readonly kind: "huge" };

const jsonNumberPattern = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/;

/**
 * Reads the source text of a JSON number (`"12"`, `"-1.0"`, `"1e3"`, `"9223372036854775807"`)
 * exactly, as decimal arithmetic, never through a double. `1.0` and `1e3` are integers; `1.5` is
 * a fraction. Cost is linear in the text (huge exponents are never expanded).
 */
export function readExactInteger(text: string): ExactInteger {
  const match = jsonNumberPattern.exec(text);
  if (match === null) return { kind: "fraction" };
  const [, sign = "", whole = "", fraction = "", exponentText = "0"] = match;
  let digits = (whole + fraction).replace(/^0+/, "");
  if (digits === "") return { kind: "integer", value: 0n };
  let exponent = Number(exponentText) - fraction.length;
  const trimmed = digits.replace(/0+$/, "");
  exponent += digits.length - trimmed.length;
  digits = trimmed;
  if (exponent < 0) return { kind: "fraction" };
  if (digits.length + exponent > 19) return { kind: "huge" };
  const magnitude = BigInt(digits) * 10n ** BigInt(exponent);
  return { kind: "integer", value: sign === "-" ? -magnitude : magnitude };
}
