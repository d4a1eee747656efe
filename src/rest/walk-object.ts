// The walk over a JSON object's keys against a table of field readers: unknown keys first, then
// every field's type before any field's range (proto/API.md §3).
import type { ApiError } from "../errors/index.js";
import { isRangeRefusal, unknownField } from "./decode-refusals.js";
import type { JsonObject } from "./strict-json.js";

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
