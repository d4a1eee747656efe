// The tensor of a REST request's steering vector (`apply_steering_vectors[i].activations`,
// proto/API.md §4, §6), read by src/lens (nested arrays or vllm-lens's encoded object). The
// vectors' other fields are read from SteeringVector's descriptor (src/surfaces/rest/descriptor-readers.ts).
import { invalidRequest } from "../../core/errors/index.js";
import { unknownField } from "../../core/json/decode-refusals.js";
import { JsonNumberText, type JsonObject, jsonNumberToDouble } from "../../core/json/strict-json.js";
import { parseTensorJson, TENSOR_KEYS } from "../../lens/index.js";
import { isObject } from "./read-json-values.js";

/** Deepest nesting accepted inside a tensor (tensors have at most 3 dimensions). */
const MAX_TENSOR_DEPTH = 16;

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

/**
 * A steering vector's `activations` (proto/API.md §6): nested number arrays, or vllm-lens's
 * encoded object, as `parseTensorJson` reads them.
 *
 * @throws ApiError 400 `invalid_request` (param `param`, or `param.<key>` for an unknown key)
 */
export function readTensor(value: unknown, param: string): ReturnType<typeof parseTensorJson> {
  return parseTensorJson(toPlainJson(value, param), param);
}
