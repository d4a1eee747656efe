// Readers of one JSON value of a request field, as REST's strict decoding takes it (proto/API.md
// §2–§4): exact integers (`2`, `2.0`, `2e0`; never `"2"`), finite doubles, booleans, strings, lists
// of int32, lists of any item. Each throws the field's type refusal, or its range refusal
// (src/core/json/decode-refusals.ts).
import { type ApiError, invalidRequest } from "../../core/errors/index.js";
import {
  INT32,
  type IntRange,
  invalidType,
  isRangeRefusal,
  nullListItem,
  outOfRange,
  rangeRefusal,
} from "../../core/json/decode-refusals.js";
import {
  isJsonNumber,
  JsonNumberText,
  type JsonObject,
  jsonNumberToDouble,
  readExactInteger,
} from "../../core/json/strict-json.js";

/** Whether `value` is a JSON object (not an array, not a number kept as text). */
export function isObject(value: unknown): value is JsonObject {
  return (
    typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof JsonNumberText)
  );
}

/** An integer field: `2`, `2.0`, `2e0`; not `"2"`, not `2.5`; must fit `range`. */
export function readInteger(value: unknown, param: string, range: IntRange = INT32): bigint {
  if (!isJsonNumber(value)) throw invalidType(param, "a number");
  const read = readExactInteger(value);
  if (read.kind === "fraction") throw invalidType(param, "an integer");
  if (read.kind === "huge" || read.value < range.min || read.value > range.max)
    throw outOfRange(param, range);
  return read.value;
}

const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;

/** An int32 field: an integer (`2`, `2.0`, `2e0`) from −2^31 to 2^31 − 1; -0 is read as 0. */
export function readInt32(value: unknown, param: string): number {
  // Fast path (token ids): a plain number is a safe integer or not an integer (see parseStrictJson).
  if (typeof value === "number" && Number.isInteger(value) && value >= INT32_MIN && value <= INT32_MAX) {
    return value + 0; // -0 → 0
  }
  return Number(readInteger(value, param, INT32));
}

/** `Invalid value for 'param': the number is too large.`, a range refusal. */
const tooLarge = (param: string) =>
  rangeRefusal(invalidRequest(param, `Invalid value for '${param}': the number is too large.`));

/** A decimal field: any JSON number (a whole number too); must be finite as a double. */
export function readDouble(value: unknown, param: string): number {
  if (!isJsonNumber(value)) throw invalidType(param, "a number");
  const number = jsonNumberToDouble(value);
  if (!Number.isFinite(number)) throw tooLarge(param);
  return number;
}

/** The largest float32 (as Connect JSON bounds a float field: src/surfaces/rpc/explain-proto-json.ts). */
const FLOAT_MAX = 3.4028234663852886e38;

/** A float field: as {@link readDouble}, and within the float32 range (|x| ≤ 3.4028234663852886e38). */
export function readFloat(value: unknown, param: string): number {
  const number = readDouble(value, param);
  if (Math.abs(number) > FLOAT_MAX) throw tooLarge(param);
  return number;
}

/** A boolean field: `true` or `false` only. */
export function readBoolean(value: unknown, param: string): boolean {
  if (typeof value !== "boolean") throw invalidType(param, "a boolean");
  return value;
}

/** A string field: a JSON string only. */
export function readString(value: unknown, param: string): string {
  if (typeof value !== "string") throw invalidType(param, "a string");
  return value;
}

/**
 * A list in protobuf JSON's words, as Connect JSON reads one (src/surfaces/rpc/explain-proto-json.ts):
 * not an array → `expected an array.` (param = the field); a null item → `a list item cannot be
 * null.` (`nullItems: "read"`: `readItem` reads a null too); each item read by `readItem`, named
 * by its index (`bad_words[1]`). Every item's type is checked before any item's range.
 */
export function readListItems<T>(
  value: unknown,
  param: string,
  readItem: (item: unknown, param: string) => T,
  nullItems: "refused" | "read" = "refused",
): T[] {
  if (!Array.isArray(value)) throw invalidType(param, "an array");
  const items: T[] = [];
  let range: ApiError | undefined;
  for (let k = 0; k < value.length; k++) {
    const item: unknown = value[k];
    const at = `${param}[${k}]`;
    if (item === null && nullItems === "refused") throw nullListItem(at);
    try {
      items.push(readItem(item, at));
    } catch (err) {
      if (!isRangeRefusal(err)) throw err;
      range ??= err;
    }
  }
  if (range !== undefined) throw range;
  return items;
}

/**
 * An array of int32 integers; anything else → `expected <expected>.` Every item's type is checked
 * before any item's range (an int32 overflow).
 */
export function readInt32Array(value: unknown, param: string, expected = "an array of integers"): number[] {
  if (!Array.isArray(value) || !allIntegers(value)) throw invalidType(param, expected);
  return readInt32Items(value, param);
}

function isIntegerItem(item: unknown): boolean {
  if (typeof item === "number") return Number.isInteger(item);
  return item instanceof JsonNumberText && readExactInteger(item).kind !== "fraction";
}

/** Whether every item of `items` is an integer (as written: `2`, `2.0`, `2e0`; any size). */
export function allIntegers(items: readonly unknown[]): boolean {
  for (let k = 0; k < items.length; k++) if (!isIntegerItem(items[k])) return false;
  return true;
}

/** Every item (all integers) as an int32; the first out of range → 400 `param`. */
export function readInt32Items(items: readonly unknown[], param: string): number[] {
  const out: number[] = [];
  for (let k = 0; k < items.length; k++) out.push(readInt32(items[k], param));
  return out;
}

/**
 * The items themselves (this decode's own array) when every one is a plain in-range integer and
 * none is -0 — the common case, checked in one pass without a copy; else undefined.
 */
export function plainInt32s(items: unknown[]): number[] | undefined {
  for (let k = 0; k < items.length; k++) {
    const item = items[k];
    if (typeof item !== "number" || !Number.isInteger(item) || item < INT32_MIN || item > INT32_MAX) {
      return undefined;
    }
    if (item === 0 && Object.is(item, -0)) return undefined;
  }
  return items as number[];
}
