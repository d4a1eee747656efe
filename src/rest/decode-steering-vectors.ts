// `apply_steering_vectors` of a REST request (proto/API.md §4, §6): each vector's fields, its
// tensor read by src/lens (nested arrays or vllm-lens's encoded object).
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { SteeringVector, SteeringVectorSchema } from "../../gen/acs/v1/lens_pb.js";
import { type ApiError, invalidRequest } from "../errors/index.js";
import { parseTensorJson, TENSOR_KEYS } from "../lens/index.js";
import { invalidType, isRangeRefusal, unknownField } from "./decode-refusals.js";
import { isObject, readBoolean, readDouble, readInt32Array } from "./read-json-values.js";
import { JsonNumberText, type JsonObject, jsonNumberToDouble } from "./strict-json.js";
import { type FieldReader, walkObject } from "./walk-object.js";

type SteeringVectorInit = Exclude<MessageInitShape<typeof SteeringVectorSchema>, SteeringVector>;

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

const steeringVectorFields = new Map<string, FieldReader<SteeringVectorInit>>([
  ["activations", (v, p) => ({ activations: parseTensorJson(toPlainJson(v, p), p) })],
  ["layer_indices", (v, p) => ({ layerIndices: readInt32Array(v, p) })],
  ["scale", (v, p) => ({ scale: readDouble(v, p) })],
  ["norm_match", (v, p) => ({ normMatch: readBoolean(v, p) })],
  ["position_indices", (v, p) => ({ positionIndices: readInt32Array(v, p) })],
]);

/** `apply_steering_vectors`: a list of objects, each walked as a SteeringVector. */
export function readSteeringVectors(value: unknown, param: string): SteeringVectorInit[] {
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
