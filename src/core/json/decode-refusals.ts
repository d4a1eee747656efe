// The refusals of REST's strict decoding (proto/API.md §2–§4): a wrong type, an unknown field, an
// integer out of its range; range refusals are marked, since every type is checked before any range.
import { type ApiError, clip, invalidRequest } from "../errors/index.js";

/** The int32 range, as the refusals name it. */
export const INT32 = { min: -(2n ** 31n), max: 2n ** 31n - 1n, name: "int32" } as const;
/** The int64 range, as the refusals name it. */
export const INT64 = { min: -(2n ** 63n), max: 2n ** 63n - 1n, name: "int64" } as const;
/** The uint32 range, as the refusals name it. */
export const UINT32 = { min: 0n, max: 2n ** 32n - 1n, name: "uint32" } as const;
/** The uint64 range, as the refusals name it. */
export const UINT64 = { min: 0n, max: 2n ** 64n - 1n, name: "uint64" } as const;
/** An integer type's range. */
export type IntRange = typeof INT32 | typeof INT64 | typeof UINT32 | typeof UINT64;

/** `Invalid type for 'param': expected <expected>.` (the seed's wording). */
export function invalidType(param: string, expected: string): ApiError {
  return invalidRequest(param, `Invalid type for '${param}': expected ${expected}.`);
}

/** A `null` item of a list (`param` names it: `bad_words[1]`); null leaves out a field, never an item. */
export function nullListItem(param: string): ApiError {
  return invalidRequest(param, `Invalid value for '${param}': a list item cannot be null.`);
}

/** OpenAI's wording for a field the API does not take. */
export function unknownField(param: string): ApiError {
  const shown = clip(param);
  return invalidRequest(shown, `Unrecognized request argument supplied: ${shown}`);
}

/**
 * Refusals of a value of the right type that is out of range (an integer outside int32/int64, a
 * number too large for a double). proto/API.md §3 checks every field's type before any range, so
 * walkObject (src/surfaces/rest/walk-object.ts) reports one of these only once every field of the body has its type checked.
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

/** `Invalid value for 'param': expected an integer from … to … (int32).`, a range refusal. */
export function outOfRange(param: string, range: IntRange): ApiError {
  return rangeRefusal(
    invalidRequest(
      param,
      `Invalid value for '${param}': expected an integer from ${range.min} to ${range.max} (${range.name}).`,
    ),
  );
}
