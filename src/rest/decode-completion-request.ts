import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  type CreateCompletionRequest,
  CreateCompletionRequestSchema,
} from "../../gen/acs/v1/completions_pb.js";
import type { SteeringVector, SteeringVectorSchema } from "../../gen/acs/v1/lens_pb.js";
import { ApiError, clip, invalidRequest } from "../errors/index.js";
import { parseTensorJson, TENSOR_KEYS } from "../lens/index.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../service/checks.js";
import {
  isJsonNumber,
  type JsonArrayCap,
  JsonNumberText,
  jsonNumberToDouble,
  parseStrictJson,
  parseStrictJsonAsync,
  readExactInteger,
} from "./strict-json.js";

/** A REST completion request, decoded: the proto request, and whether `stream: true` was sent. */
export interface DecodedCompletionRequest {
  readonly request: CreateCompletionRequest;
  /** `stream` of the body (false when left out or null); selects StreamCompletion. */
  readonly stream: boolean;
}

/** The object form of a message init (every field optional), not the message itself. */
type RequestInit = Exclude<MessageInitShape<typeof CreateCompletionRequestSchema>, CreateCompletionRequest>;
type SteeringVectorInit = Exclude<MessageInitShape<typeof SteeringVectorSchema>, SteeringVector>;
export type JsonObject = Record<string, unknown>;

const INT32 = { min: -(2n ** 31n), max: 2n ** 31n - 1n, name: "int32" } as const;
const INT64 = { min: -(2n ** 63n), max: 2n ** 63n - 1n, name: "int64" } as const;
type IntRange = typeof INT32 | typeof INT64;

const PROMPT_EXPECTED =
  "a string, an array of strings, an array of integers, or an array of arrays of integers";
/** Deepest nesting accepted inside a tensor (tensors have at most 3 dimensions). */
const MAX_TENSOR_DEPTH = 16;

/** `Invalid type for 'param': expected <expected>.` (the seed's wording). */
export function invalidType(param: string, expected: string): ApiError {
  return invalidRequest(param, `Invalid type for '${param}': expected ${expected}.`);
}

/** OpenAI's wording for a field the API does not take. */
export function unknownField(param: string): ApiError {
  const shown = clip(param);
  return invalidRequest(shown, `Unrecognized request argument supplied: ${shown}`);
}

/**
 * Refusals of a value of the right type that is out of range (an integer outside int32/int64, a
 * number too large for a double). proto/API.md §3 checks every field's type before any range, so
 * {@link walkObject} reports one of these only once every field of the body has its type checked.
 */
const rangeRefusals = new WeakSet<ApiError>();

/** `err`, marked as a range refusal (see {@link rangeRefusals}). */
export function rangeRefusal(err: ApiError): ApiError {
  rangeRefusals.add(err);
  return err;
}

/** Whether `err` is a range refusal, reported after every type refusal (see {@link rangeRefusals}). */
export function isRangeRefusal(err: unknown): err is ApiError {
  return err instanceof Error && rangeRefusals.has(err as ApiError);
}

function outOfRange(param: string, range: IntRange): ApiError {
  return rangeRefusal(
    invalidRequest(
      param,
      `Invalid value for '${param}': expected an integer from ${range.min} to ${range.max} (${range.name}).`,
    ),
  );
}

export function isObject(value: unknown): value is JsonObject {
  return (
    typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof JsonNumberText)
  );
}

/** An integer field: `2`, `2.0`, `2e0`; not `"2"`, not `2.5`; must fit `range`. */
function readInteger(value: unknown, param: string, range: IntRange = INT32): bigint {
  if (!isJsonNumber(value)) throw invalidType(param, "a number");
  const read = readExactInteger(value);
  if (read.kind === "fraction") throw invalidType(param, "an integer");
  if (read.kind === "huge" || read.value < range.min || read.value > range.max)
    throw outOfRange(param, range);
  return read.value;
}

const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;

function readInt32(value: unknown, param: string): number {
  // Fast path (token ids): a plain number is a safe integer or not an integer (see parseStrictJson).
  if (typeof value === "number" && Number.isInteger(value) && value >= INT32_MIN && value <= INT32_MAX) {
    return value + 0; // -0 → 0
  }
  return Number(readInteger(value, param, INT32));
}

/** A decimal field: any JSON number (a whole number too); must be finite as a double. */
function readDouble(value: unknown, param: string): number {
  if (!isJsonNumber(value)) throw invalidType(param, "a number");
  const number = jsonNumberToDouble(value);
  if (!Number.isFinite(number)) {
    throw rangeRefusal(invalidRequest(param, `Invalid value for '${param}': the number is too large.`));
  }
  return number;
}

export function readBoolean(value: unknown, param: string): boolean {
  if (typeof value !== "boolean") throw invalidType(param, "a boolean");
  return value;
}

export function readString(value: unknown, param: string): string {
  if (typeof value !== "string") throw invalidType(param, "a string");
  return value;
}

/**
 * An array of int32 integers; anything else → `expected <expected>.` Every item's type is checked
 * before any item's range (an int32 overflow).
 */
export function readInt32Array(value: unknown, param: string, expected = "an array of integers"): number[] {
  if (!Array.isArray(value) || !allIntegers(value)) throw invalidType(param, expected);
  return readInt32Items(value, param);
}

/**
 * What a string holds, read by one scan: `-?digits` is an integer (its sign and its digits without
 * leading zeros); `-?digits(.digits)?([eE][+-]?digits)?` is some other decimal numeral.
 */
function classifyNumeral(
  text: string,
): { kind: "integer"; negative: boolean; digits: string } | { kind: "decimal" | "none" } {
  const n = text.length;
  let i = text.charCodeAt(0) === 0x2d ? 1 : 0;
  const isDigit = (at: number) => at < n && text.charCodeAt(at) >= 0x30 && text.charCodeAt(at) <= 0x39;
  const start = i;
  while (i < n && text.charCodeAt(i) === 0x30) i++;
  const significant = i;
  while (isDigit(i)) i++;
  if (i === start) return { kind: "none" };
  if (i === n) return { kind: "integer", negative: start === 1, digits: text.slice(significant) };
  if (text.charCodeAt(i) === 0x2e) {
    i++;
    if (!isDigit(i)) return { kind: "none" };
    while (isDigit(i)) i++;
  }
  if (i < n && (text.charCodeAt(i) | 0x20) === 0x65) {
    i++;
    if (i < n && (text.charCodeAt(i) === 0x2b || text.charCodeAt(i) === 0x2d)) i++;
    if (!isDigit(i)) return { kind: "none" };
    while (isDigit(i)) i++;
  }
  return i === n ? { kind: "decimal" } : { kind: "none" };
}

/**
 * The integer a JSON string holds, as `priority` takes one (`"2"`, `"-3"`, `"007"`: an optional
 * `-` and decimal digits; Connect JSON's integer fields read their strings the same way); `"huge"`
 * past 20 digits (beyond every 64-bit integer: never parsed, however long); else the type fault
 * (`"2.0"`, `"1e2"`: not an integer; `"0x10"`, `" 5"`, `"+2"`: not a number).
 */
export function integerInString(value: string, param: string): bigint | "huge" | ApiError {
  const numeral = classifyNumeral(value);
  if (numeral.kind !== "integer") {
    return invalidType(param, numeral.kind === "decimal" ? "an integer" : "a number");
  }
  if (numeral.digits.length > 20) return "huge";
  const magnitude = BigInt(numeral.digits === "" ? "0" : numeral.digits);
  return numeral.negative ? -magnitude : magnitude;
}

/** `priority`: an integer, or a string holding one (`"2"`, `"-3"`), within int32. */
function readPriority(value: unknown, param: string): number {
  if (typeof value === "string") {
    const read = integerInString(value, param);
    if (read instanceof ApiError) throw read;
    if (read === "huge" || read < INT32.min || read > INT32.max) throw outOfRange(param, INT32);
    return Number(read);
  }
  return readInt32(value, param);
}

function isIntegerItem(item: unknown): boolean {
  if (typeof item === "number") return Number.isInteger(item);
  return item instanceof JsonNumberText && readExactInteger(item).kind !== "fraction";
}

/** Whether every item of `items` is an integer (as written: `2`, `2.0`, `2e0`; any size). */
function allIntegers(items: readonly unknown[]): boolean {
  for (let k = 0; k < items.length; k++) if (!isIntegerItem(items[k])) return false;
  return true;
}

/** Every item (all integers) as an int32; the first out of range → 400 `param`. */
function readInt32Items(items: readonly unknown[], param: string): number[] {
  const out: number[] = [];
  for (let k = 0; k < items.length; k++) out.push(readInt32(items[k], param));
  return out;
}

/**
 * The items themselves (this decode's own array) when every one is a plain in-range integer and
 * none is -0 — the common case, checked in one pass without a copy; else undefined.
 */
function plainInt32s(items: unknown[]): number[] | undefined {
  for (let k = 0; k < items.length; k++) {
    const item = items[k];
    if (typeof item !== "number" || !Number.isInteger(item) || item < INT32_MIN || item > INT32_MAX) {
      return undefined;
    }
    if (item === 0 && Object.is(item, -0)) return undefined;
  }
  return items as number[];
}

/** `prompt`: string → text; string[] → texts; int[] → token_ids; int[][] → token_ids_list. */
function readPrompt(value: unknown): NonNullable<RequestInit["prompt"]> {
  const param = "prompt";
  if (typeof value === "string") return { case: "text", value };
  if (!Array.isArray(value)) throw invalidType(param, PROMPT_EXPECTED);
  if (value.length === 0 || value.every((item) => typeof item === "string")) {
    return { case: "texts", value: { values: value as string[] } };
  }
  const ids = plainInt32s(value);
  if (ids !== undefined) return { case: "tokenIds", value: { values: ids } };
  if (allIntegers(value)) {
    return { case: "tokenIds", value: { values: readInt32Items(value, param) } };
  }
  if (value.every((item) => Array.isArray(item) && allIntegers(item))) {
    return {
      case: "tokenIdsList",
      value: {
        values: (value as unknown[][]).map((list) => ({
          values: plainInt32s(list) ?? readInt32Items(list, param),
        })),
      },
    };
  }
  throw invalidType(param, PROMPT_EXPECTED);
}

function readStop(value: unknown): string[] {
  if (typeof value === "string") return [value];
  if (Array.isArray(value) && value.every((item) => typeof item === "string")) return value as string[];
  throw invalidType("stop", "a string or an array of strings");
}

function readOutputResidualStream(value: unknown): Partial<RequestInit> {
  const param = "output_residual_stream";
  // `false` is a wrong type, not "left out" (proto/API.md §2: int[] or true); only null is left out.
  if (value === true) return { outputResidualStream: { allLayers: true } };
  const expected = "an array of integers or true";
  if (Array.isArray(value)) {
    return { outputResidualStream: { layerIndices: readInt32Array(value, param, expected) } };
  }
  throw invalidType(param, expected);
}

/** Reads one field's JSON value (never null) into a fragment of the message init `T`. */
export type FieldReader<T> = (value: unknown, param: string) => Partial<T>;

/**
 * Walks an object's keys against `fields`: unknown keys first (all of them, before any type), then
 * each known field in body order; `null` = left out. Returns the merged init fragments.
 */
export function walkObject<T extends object>(
  object: JsonObject,
  prefix: string,
  fields: ReadonlyMap<string, FieldReader<T>>,
): Partial<T> {
  const keys = Object.keys(object);
  for (const key of keys) {
    if (!fields.has(key)) throw unknownField(prefix + key);
  }
  const init: Partial<T> = {};
  // Types before ranges (proto/API.md §3): the first range refusal waits until every field's type
  // has been checked.
  let range: ApiError | undefined;
  for (const key of keys) {
    const value = object[key];
    const read = fields.get(key);
    if (value === null || read === undefined) continue;
    try {
      Object.assign(init, read(value, prefix + key));
    } catch (err) {
      if (!isRangeRefusal(err)) throw err;
      range ??= err;
    }
  }
  if (range !== undefined) throw range;
  return init;
}

type StreamOptionsInit = NonNullable<RequestInit["streamOptions"]>;

const streamOptionsFields = new Map<string, FieldReader<StreamOptionsInit>>([
  ["include_usage", (v, p) => ({ includeUsage: readBoolean(v, p) })],
  ["continuous_usage_stats", (v, p) => ({ continuousUsageStats: readBoolean(v, p) })],
]);

function readStreamOptions(value: unknown, param: string): StreamOptionsInit {
  if (!isObject(value)) throw invalidType(param, "an object");
  return walkObject(value, `${param}.`, streamOptionsFields);
}

/**
 * A tensor's JSON in the form `parseTensorJson` expects (what JSON.parse would give): every number
 * a plain JS number — arrays are rewritten in place (they are this decode's own), objects copied
 * into ordinary ones. Prototype keys, and keys a tensor object does not have, are refused here
 * (unknown fields, param `….activations.<key>`); at most MAX_TENSOR_DEPTH levels.
 */
function toPlainJson(value: unknown, param: string, depth = 0): unknown {
  if (depth > MAX_TENSOR_DEPTH) {
    throw invalidRequest(param, `Invalid value for '${param}': nested too deeply.`);
  }
  if (value instanceof JsonNumberText) return jsonNumberToDouble(value);
  if (Array.isArray(value)) {
    for (let k = 0; k < value.length; k++) {
      const item: unknown = value[k];
      if (typeof item === "object" && item !== null) value[k] = toPlainJson(item, param, depth + 1);
    }
    return value;
  }
  if (isObject(value)) {
    const copy: JsonObject = {};
    for (const key of Object.keys(value)) {
      // The tensor object's own keys are fields of the request like any other (proto/API.md §4).
      if (
        key === "__proto__" ||
        key === "constructor" ||
        key === "prototype" ||
        (depth === 0 && !TENSOR_KEYS.has(key))
      ) {
        throw unknownField(`${param}.${key}`);
      }
      copy[key] = toPlainJson(value[key], param, depth + 1);
    }
    return copy;
  }
  return value;
}

const steeringVectorFields = new Map<string, FieldReader<SteeringVectorInit>>([
  ["activations", (v, p) => ({ activations: parseTensorJson(toPlainJson(v, p), p) })],
  ["layer_indices", (v, p) => ({ layerIndices: readInt32Array(v, p) })],
  ["scale", (v, p) => ({ scale: readDouble(v, p) })],
  ["norm_match", (v, p) => ({ normMatch: readBoolean(v, p) })],
  ["position_indices", (v, p) => ({ positionIndices: readInt32Array(v, p) })],
]);

function readSteeringVectors(value: unknown, param: string): SteeringVectorInit[] {
  if (!Array.isArray(value)) throw invalidType(param, "an array");
  // Every vector's types before any vector's range (see walkObject).
  let range: ApiError | undefined;
  const vectors: SteeringVectorInit[] = [];
  for (let index = 0; index < value.length; index++) {
    const item: unknown = value[index];
    const itemParam = `${param}[${index}]`;
    if (!isObject(item)) throw invalidType(itemParam, "an object");
    try {
      vectors.push(walkObject(item, `${itemParam}.`, steeringVectorFields));
    } catch (err) {
      if (!isRangeRefusal(err)) throw err;
      range ??= err;
    }
  }
  if (range !== undefined) throw range;
  return vectors;
}

/** The body's fields: every request field of proto/API.md §2, plus `stream` (it selects the RPC). */
type BodyInit = RequestInit & { stream?: boolean };

const requestFields = new Map<string, FieldReader<BodyInit>>([
  ["model", (v, p) => ({ model: readString(v, p) })],
  ["prompt", (v) => ({ prompt: readPrompt(v) })],
  ["max_tokens", (v, p) => ({ maxTokens: readInt32(v, p) })],
  ["n", (v, p) => ({ n: readInt32(v, p) })],
  ["temperature", (v, p) => ({ temperature: readDouble(v, p) })],
  ["top_p", (v, p) => ({ topP: readDouble(v, p) })],
  ["stop", (v) => ({ stop: readStop(v) })],
  ["stream", (v, p) => ({ stream: readBoolean(v, p) })],
  ["stream_options", (v, p) => ({ streamOptions: readStreamOptions(v, p) })],
  ["logprobs", (v, p) => ({ logprobs: readInt32(v, p) })],
  ["echo", (v, p) => ({ echo: readBoolean(v, p) })],
  ["presence_penalty", (v, p) => ({ presencePenalty: readDouble(v, p) })],
  ["frequency_penalty", (v, p) => ({ frequencyPenalty: readDouble(v, p) })],
  ["seed", (v, p) => ({ seed: readInteger(v, p, INT64) })],
  ["user", (v, p) => ({ user: readString(v, p) })],
  ["top_k", (v, p) => ({ topK: readInt32(v, p) })],
  ["min_p", (v, p) => ({ minP: readDouble(v, p) })],
  ["repetition_penalty", (v, p) => ({ repetitionPenalty: readDouble(v, p) })],
  ["min_tokens", (v, p) => ({ minTokens: readInt32(v, p) })],
  ["ignore_eos", (v, p) => ({ ignoreEos: readBoolean(v, p) })],
  ["stop_token_ids", (v, p) => ({ stopTokenIds: readInt32Array(v, p) })],
  ["include_stop_str_in_output", (v, p) => ({ includeStopStrInOutput: readBoolean(v, p) })],
  ["skip_special_tokens", (v, p) => ({ skipSpecialTokens: readBoolean(v, p) })],
  ["spaces_between_special_tokens", (v, p) => ({ spacesBetweenSpecialTokens: readBoolean(v, p) })],
  ["add_special_tokens", (v, p) => ({ addSpecialTokens: readBoolean(v, p) })],
  ["prompt_logprobs", (v, p) => ({ promptLogprobs: readInt32(v, p) })],
  ["return_token_ids", (v, p) => ({ returnTokenIds: readBoolean(v, p) })],
  ["priority", (v, p) => ({ priority: readPriority(v, p) })],
  ["output_residual_stream", (v) => readOutputResidualStream(v)],
  ["apply_steering_vectors", (v, p) => ({ applySteeringVectors: readSteeringVectors(v, p) })],
]);

/** The JSON names of every field `POST /v1/completions` takes (proto/API.md §2). */
export const completionRequestFieldNames: readonly string[] = [...requestFields.keys()];

/**
 * §3: a `prompt` list (strings, or token-id lists) longer than any size cap allows is refused
 * while the body is parsed, as soon as its item 32,001 is read (src/service/checks.ts).
 */
export const PROMPT_LIST_CAP: JsonArrayCap = {
  path: ["prompt"],
  maxItems: maxPromptsPerRequest,
  refuse: tooManyPrompts,
};

/** The decoded request of a parsed body (a JSON object, else 400). */
function toCompletionRequest(json: unknown): DecodedCompletionRequest {
  if (!isObject(json)) throw invalidRequest(null, "The request body must be a JSON object.");
  const { stream = false, ...init } = walkObject(json, "", requestFields);
  return { request: create(CreateCompletionRequestSchema, init), stream };
}

/**
 * Decodes the JSON body of `POST /v1/completions` strictly (proto/API.md §2, §4) into the proto request.
 *
 * - The body is parsed by `parseStrictJson` (strict UTF-8, no BOM, duplicate keys with different
 *   values refused, no prototype keys, exact numbers), in time linear in its length.
 * - Numbers are read exactly: integer fields take `2`, `2.0`, `2e0` within int32
 *   (`seed`: int64, exact); decimal fields take any finite number; `"2"` is a number only for
 *   `priority`. `null` means left out, for every field (`output_residual_stream: false` is a wrong
 *   type: it takes an array of integers or `true`).
 * - Only shapes and types are checked here (and int32/int64 representability); ranges and
 *   cross-field rules (n vs temperature, stream_options without stream, …) are the service's.
 * - Unknown fields are refused before any type is checked; then fields in body order.
 * - A `prompt` list of more than 32,000 prompts is refused while the body is parsed
 *   ({@link PROMPT_LIST_CAP}): before anything after it in the body is read or checked.
 *
 * @param body the raw request body: its bytes (strict UTF-8), or text
 * @returns the proto request and `stream` (which selects CreateCompletion or StreamCompletion)
 * @throws ApiError 400 `invalid_request`: invalid UTF-8, malformed JSON or a non-object body
 *   (param null); an unknown field (param = the field, dotted for nested: `stream_options.foo`);
 *   a wrong type (`Invalid type for 'max_tokens': expected a number.`); an integer outside
 *   int32/int64; and
 *   whatever `parseTensorJson` throws for `apply_steering_vectors[i].activations`.
 */
export function decodeCompletionRequest(body: string | Uint8Array): DecodedCompletionRequest {
  return toCompletionRequest(parseStrictJson(body, [PROMPT_LIST_CAP]));
}

/**
 * {@link decodeCompletionRequest} as the REST route runs it: the same decoding, with the JSON
 * parse of a big body done in slices that yield to the event loop (`parseStrictJsonAsync`), so
 * that a max-size body does not hold up other callers while it is parsed.
 *
 * @throws ApiError as {@link decodeCompletionRequest} (the promise rejects)
 */
export async function decodeCompletionRequestAsync(body: Uint8Array): Promise<DecodedCompletionRequest> {
  return toCompletionRequest(await parseStrictJsonAsync(body, undefined, [PROMPT_LIST_CAP]));
}
