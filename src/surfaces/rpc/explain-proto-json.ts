import {
  type DescEnum,
  type DescField,
  type DescMessage,
  type DescOneof,
  fromJson,
  type JsonValue,
  ScalarType,
} from "@bufbuild/protobuf";
import { base64Decode } from "@bufbuild/protobuf/wire";
import { ApiError, clip, invalidRequest } from "../../core/errors/index.js";
import {
  invalidType,
  isRangeRefusal,
  nullListItem,
  rangeRefusal,
  unknownField,
} from "../../core/json/decode-refusals.js";
import { integerInString } from "../../core/json/integer-in-string.js";
import {
  isJsonNumber,
  parseStrictJson,
  readExactInteger,
  readExactIntegerText,
} from "../../core/json/strict-json.js";
import { jsonArrayCapsOf } from "./prompt-list-caps.js";

type JsonObject = Record<string, unknown>;

function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !isJsonNumber(value);
}

interface IntRange {
  readonly min: bigint;
  readonly max: bigint;
  readonly name: string;
}

const INT32: IntRange = { min: -(2n ** 31n), max: 2n ** 31n - 1n, name: "int32" };
const UINT32: IntRange = { min: 0n, max: 2n ** 32n - 1n, name: "uint32" };
const INT64: IntRange = { min: -(2n ** 63n), max: 2n ** 63n - 1n, name: "int64" };
const UINT64: IntRange = { min: 0n, max: 2n ** 64n - 1n, name: "uint64" };

const FLOAT_MAX = 3.4028234663852886e38;

function intRange(scalar: ScalarType): IntRange | undefined {
  switch (scalar) {
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return INT32;
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return UINT32;
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
      return INT64;
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return UINT64;
    default:
      return undefined;
  }
}

function checkInteger(value: unknown, param: string, range: IntRange): ApiError | undefined {
  let integer: bigint | "huge";
  if (typeof value === "string") {
    // As REST reads priority's string: an integer field's string holds `-?digits`.
    const read = integerInString(value, param);
    if (read instanceof ApiError) return read;
    integer = read;
  } else if (isJsonNumber(value)) {
    const text = typeof value === "number" ? String(value) : value.text;
    const read = readExactIntegerText(text);
    if (read.kind === "fraction") return invalidType(param, "an integer");
    integer = read.kind === "huge" ? "huge" : read.value;
  } else {
    return invalidType(param, "a number");
  }
  if (integer === "huge" || integer < range.min || integer > range.max) {
    return rangeRefusal(
      invalidRequest(
        param,
        `Invalid value for '${param}': expected an integer from ${range.min} to ${range.max} (${range.name}).`,
      ),
    );
  }
  return undefined;
}

function checkFloat(value: unknown, param: string, scalar: ScalarType): ApiError | undefined {
  if (!isJsonNumber(value)) return invalidType(param, "a number");
  const number = Number(typeof value === "number" ? value : value.text);
  const max = scalar === ScalarType.FLOAT ? FLOAT_MAX : Number.MAX_VALUE;
  if (!Number.isFinite(number) || Math.abs(number) > max) {
    return rangeRefusal(invalidRequest(param, `Invalid value for '${param}': the number is too large.`));
  }
  return undefined;
}

/**
 * Whether a JSON string may hold the field's number: an int64's (protobuf JSON writes 64-bit
 * integers as strings, so every generated client sends `seed` so), and `priority`'s (REST takes
 * it too). Any other number in a string is not a number (proto/API.md §4), on Connect as on REST.
 */
function numberInStringAllowed(field: DescField, range: IntRange | undefined): boolean {
  if (range === INT64 || range === UINT64) return true;
  return field.name === "priority" && field.parent.typeName === "acs.v1.CreateCompletionRequest";
}

function checkScalar(
  field: DescField,
  scalar: ScalarType,
  value: unknown,
  param: string,
): ApiError | undefined {
  const range = intRange(scalar);
  const isNumeric = range !== undefined || scalar === ScalarType.DOUBLE || scalar === ScalarType.FLOAT;
  if (isNumeric && typeof value === "string" && !numberInStringAllowed(field, range)) {
    return invalidType(param, "a number");
  }
  if (range !== undefined) return checkInteger(value, param, range);
  switch (scalar) {
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return checkFloat(value, param, scalar);
    case ScalarType.BOOL:
      return typeof value === "boolean" ? undefined : invalidType(param, "a boolean");
    case ScalarType.STRING:
      return typeof value === "string" ? undefined : invalidType(param, "a string");
    case ScalarType.BYTES:
      if (typeof value !== "string") return invalidType(param, "a base64 string");
      try {
        base64Decode(value);
        return undefined;
      } catch {
        return invalidRequest(param, `Invalid value for '${param}': expected a base64 string.`);
      }
    default:
      return undefined;
  }
}

function checkEnum(desc: DescEnum, value: unknown, param: string): ApiError | undefined {
  if (typeof value === "string" && desc.values.some((v) => v.name === value)) return undefined;
  if (isJsonNumber(value)) {
    const read = readExactInteger(value);
    if (read.kind === "integer" && read.value >= INT32.min && read.value <= INT32.max) return undefined;
  }
  const names = desc.values.map((v) => v.name).join(", ");
  return invalidRequest(param, `Invalid value for '${param}': expected one of ${names}.`);
}

/** One value of a field (a list item, a map value, or the field's own value). */
function checkValue(field: DescField, value: unknown, param: string): ApiError | undefined {
  if (field.message !== undefined) return checkMessage(field.message, value, param);
  if (field.enum !== undefined) return checkEnum(field.enum, value, param);
  if (field.scalar !== undefined) return checkScalar(field, field.scalar, value, param);
  return undefined;
}

function checkField(field: DescField, value: unknown, param: string): ApiError | undefined {
  if (value === null) return undefined; // null is "left out" in protobuf JSON
  switch (field.fieldKind) {
    case "list": {
      if (!Array.isArray(value)) return invalidType(param, "an array");
      let range: ApiError | undefined;
      for (const [i, item] of value.entries()) {
        const at = `${param}[${i}]`;
        if (item === null) return nullListItem(at);
        const err = checkValue(field, item, at);
        if (err === undefined) continue;
        if (!isRangeRefusal(err)) return err;
        range ??= err; // types before ranges (proto/API.md §3), as REST
      }
      return range;
    }
    case "map": {
      if (!isObject(value)) return invalidType(param, "an object");
      let range: ApiError | undefined;
      for (const [key, item] of Object.entries(value)) {
        const at = `${param}.${key}`;
        if (item === null)
          return invalidRequest(at, `Invalid value for '${at}': a map value cannot be null.`);
        const err = checkValue(field, item, at);
        if (err === undefined) continue;
        if (!isRangeRefusal(err)) return err;
        range ??= err;
      }
      return range;
    }
    default:
      return checkValue(field, value, param);
  }
}

/**
 * A fault of a value inside a member of a top-level oneof, named by the oneof as REST names it:
 * REST's `prompt` is the oneof `prompt` (`text`, `texts`, `token_ids`, `token_ids_list`), and a bad
 * token id is `prompt` on every surface (as the service's own checks of a prompt name it), not
 * `token_ids.values[1]`. An unknown key inside a member (`texts.valuez`) keeps its path.
 */
function inOneofTerms(fault: ApiError | undefined, path: string, field: DescField): ApiError | undefined {
  if (fault === undefined || path !== "" || field.oneof === undefined || fault.param === null) return fault;
  // A fault of a value (its type, its range); an unknown key inside a member keeps its own path.
  const quoted = `'${fault.param}'`;
  if (!fault.message.includes(quoted)) return fault;
  const name = field.oneof.name;
  const renamed = new ApiError(fault.code, fault.message.replace(quoted, `'${name}'`), { param: name });
  return isRangeRefusal(fault) ? rangeRefusal(renamed) : renamed;
}

/**
 * The first fault of `value` as the JSON of `desc`, in the REST decoder's words: unknown keys
 * first (all of an object's keys before any of its values, as REST does), then each field's type,
 * depth first, and only then the first range fault (an integer outside its type, a number too
 * large), as REST orders them (proto/API.md §3: types, then ranges). Params are proto field names
 * with `.` and `[i]` (REST's names); a fault of a value inside the prompt oneof is `prompt`, as on
 * REST ({@link inOneofTerms}).
 */
function checkMessage(desc: DescMessage, value: unknown, path: string): ApiError | undefined {
  // Well-known types have JSON forms of their own; protobuf-es explains those (fallback below).
  if (desc.typeName.startsWith("google.protobuf.")) return undefined;
  if (!isObject(value)) {
    return path === ""
      ? invalidRequest(null, "The request body must be a JSON object.")
      : invalidType(path, "an object");
  }
  const prefix = path === "" ? "" : `${path}.`;
  const byName = new Map<string, DescField>();
  for (const f of desc.fields) byName.set(f.name, f).set(f.jsonName, f);
  for (const key of Object.keys(value)) {
    if (!byName.has(key)) return unknownField(prefix + key);
  }
  const seen = new Map<DescField, string>();
  const oneofs = new Map<DescOneof, DescField>();
  // Types before ranges (proto/API.md §3), as REST: the first range fault waits for every type.
  let range: ApiError | undefined;
  for (const [key, item] of Object.entries(value)) {
    const field = byName.get(key) as DescField;
    const param = prefix + field.name;
    const before = seen.get(field);
    if (before !== undefined) {
      return invalidRequest(param, `'${param}' is set twice: as '${before}' and as '${key}'.`);
    }
    seen.set(field, key);
    if (field.oneof !== undefined && item !== null) {
      const other = oneofs.get(field.oneof);
      if (other !== undefined) {
        const members = field.oneof.fields.map((f) => f.name).join(", ");
        return invalidRequest(
          prefix + field.oneof.name,
          `Only one of ${members} may be set ('${field.oneof.name}'); got ${other.name} and ${field.name}.`,
        );
      }
      oneofs.set(field.oneof, field);
    }
    const err = inOneofTerms(checkField(field, item, param), path, field);
    if (err === undefined) continue;
    if (!isRangeRefusal(err)) return err;
    range ??= err;
  }
  return range;
}

/**
 * The first fault of `json` (parsed by {@link parseStrictJson}) as a `desc` message in protobuf
 * JSON, in the REST decoder's words (see {@link explainProtoJson}); undefined when it has none.
 */
export function checkProtoJson(desc: DescMessage, json: unknown): ApiError | undefined {
  return checkMessage(desc, json, "");
}

/**
 * Explains why `bytes` is not a `desc` message in protobuf JSON, for a request connect-es refused
 * while parsing it (connect-es's own message names no field). Same words as the REST decoder for
 * the same faults — invalid UTF-8, malformed JSON (REST's parser), an unknown field, a wrong type,
 * an integer out of range — with `param` the proto field path (`max_tokens`,
 * `apply_steering_vectors[0].scale`). Returns undefined when it finds no fault.
 */
export function explainProtoJson(desc: DescMessage, bytes: Uint8Array): ApiError | undefined {
  let json: unknown;
  try {
    json = parseStrictJson(bytes, jsonArrayCapsOf(desc));
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  const fault = checkMessage(desc, json, "");
  if (fault !== undefined) return fault;
  try {
    fromJson(desc, JSON.parse(new TextDecoder().decode(bytes)) as JsonValue);
    return undefined;
  } catch (err) {
    const detail = err instanceof Error ? err.message : String(err);
    return invalidRequest(
      null,
      `The request body is not a valid ${desc.typeName} in protobuf JSON: ${clip(detail)}.`,
    );
  }
}
