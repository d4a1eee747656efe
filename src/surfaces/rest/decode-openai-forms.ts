// The JSON forms of OpenAI's completions API that REST takes beyond proto JSON (proto/API.md §2):
// `prompt` as a string, strings, token ids or lists of token ids; `stop` as one string or a list;
// `priority` as an integer or a string holding one; `output_residual_stream` as layer indices or
// `true`. The table of forms (src/surfaces/rest/rest-json-forms.ts) names them for the decoder and the
// OpenAPI document.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type {
  CreateCompletionRequest,
  CreateCompletionRequestSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../core/errors/index.js";
import { INT32, invalidType, outOfRange } from "../../core/json/decode-refusals.js";
import { integerInString } from "../../core/json/integer-in-string.js";
import { allIntegers, plainInt32s, readInt32, readInt32Array, readInt32Items } from "./read-json-values.js";

/** The object form of the request's message init (every field optional), not the message itself. */
export type RequestInit = Exclude<
  MessageInitShape<typeof CreateCompletionRequestSchema>,
  CreateCompletionRequest
>;

const PROMPT_EXPECTED =
  "a string, an array of strings, an array of integers, or an array of arrays of integers";

/** `priority`: an integer, or a string holding one (`"2"`, `"-3"`), within int32. */
export function readPriority(value: unknown, param: string): number {
  if (typeof value === "string") {
    const read = integerInString(value, param);
    if (read instanceof ApiError) throw read;
    if (read === "huge" || read < INT32.min || read > INT32.max) throw outOfRange(param, INT32);
    return Number(read);
  }
  return readInt32(value, param);
}

/** `prompt`: string → text; string[] → texts; int[] → token_ids; int[][] → token_ids_list. */
export function readPrompt(value: unknown, param: string): NonNullable<RequestInit["prompt"]> {
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

/** `stop`: one string, or a list of strings. */
export function readStop(value: unknown, param: string): string[] {
  if (typeof value === "string") return [value];
  if (Array.isArray(value) && value.every((item) => typeof item === "string")) return value as string[];
  throw invalidType(param, "a string or an array of strings");
}

/** `output_residual_stream`: a list of layer indices, or `true` (all layers). */
export function readOutputResidualStream(
  value: unknown,
  param: string,
): NonNullable<RequestInit["outputResidualStream"]> {
  // `false` is a wrong type, not "left out" (proto/API.md §2: int[] or true); only null is left out.
  if (value === true) return { allLayers: true };
  const expected = "an array of integers or true";
  if (Array.isArray(value)) return { layerIndices: readInt32Array(value, param, expected) };
  throw invalidType(param, expected);
}
