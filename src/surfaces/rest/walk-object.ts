// The walk over a JSON object's keys against a table of field readers: unknown keys first, then
// every field's type before any field's range (proto/API.md §3).
import type { ApiError } from "../../core/errors/index.js";
import { isRangeRefusal, unknownField } from "../../core/json/decode-refusals.js";
import type { JsonObject } from "../../core/json/strict-json.js";

/** Reads one JSON value (never null) of a field; `param` names it in a refusal. */
export type ValueReader = (value: unknown, param: string) => unknown;

/** One field of a table: the message init's key it is read into (its localName), and its reader. */
export interface FieldReader {
  readonly key: string;
  readonly read: ValueReader;
}

/**
 * Walks an object's keys against `fields` (REST JSON name → reader): unknown keys first (all of
 * them, before any type), then each known field in body order; `null` = left out. Returns the
 * message init: each field's value under its reader's key.
 */
export function walkObject(
  object: JsonObject,
  prefix: string,
  fields: ReadonlyMap<string, FieldReader>,
): Record<string, unknown> {
  const keys = Object.keys(object);
  for (const key of keys) {
    if (!fields.has(key)) throw unknownField(prefix + key);
  }
  const init: Record<string, unknown> = {};
  // Types before ranges (proto/API.md §3): the first range refusal waits until every field's type
  // has been checked.
  let range: ApiError | undefined;
  for (const key of keys) {
    const value = object[key];
    const field = fields.get(key);
    if (value === null || field === undefined) continue;
    try {
      init[field.key] = field.read(value, prefix + key);
    } catch (err) {
      if (!isRangeRefusal(err)) throw err;
      range ??= err;
    }
  }
  if (range !== undefined) throw range;
  return init;
}
