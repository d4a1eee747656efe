// REST's strict decoder of `POST /v1/completions` bodies (proto/API.md §2, §4): the table of the
// request's fields, each read into the proto request's init. The readers live by concern beside
// it: values (read-json-values.ts), refusals (decode-refusals.ts), OpenAI's forms
// (decode-openai-forms.ts), steering vectors (decode-steering-vectors.ts), the walk (walk-object.ts).
import { create } from "@bufbuild/protobuf";
import {
  type CreateCompletionRequest,
  CreateCompletionRequestSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { invalidRequest } from "../errors/index.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../service/checks.js";
import {
  type RequestInit,
  readOutputResidualStream,
  readPriority,
  readPrompt,
  readStop,
} from "./decode-openai-forms.js";
import { INT64, invalidType } from "./decode-refusals.js";
import { readSteeringVectors } from "./decode-steering-vectors.js";
import {
  isObject,
  readBoolean,
  readDouble,
  readInt32,
  readInt32Array,
  readInteger,
  readString,
  readStringList,
} from "./read-json-values.js";
import { type JsonArrayCap, parseStrictJson, parseStrictJsonAsync } from "./strict-json.js";
import { type FieldReader, walkObject } from "./walk-object.js";

/** A REST completion request, decoded: the proto request, and whether `stream: true` was sent. */
export interface DecodedCompletionRequest {
  readonly request: CreateCompletionRequest;
  /** `stream` of the body (false when left out or null); selects StreamCompletion. */
  readonly stream: boolean;
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
  ["bad_words", (v, p) => ({ badWords: readStringList(v, p) })],
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
