// REST's strict decoder of `POST /v1/completions` bodies (proto/API.md §2, §4): the request's
// fields are read from CreateCompletionRequest's descriptor (src/surfaces/rest/descriptor-readers.ts), with
// REST's own JSON forms and `stream` from the one table of forms (src/surfaces/rest/rest-json-forms.ts).
// The readers live by concern beside it: values (read-json-values.ts), refusals
// (decode-refusals.ts), OpenAI's forms (decode-openai-forms.ts), tensors
// (decode-steering-vectors.ts), the walk (walk-object.ts).
import { create } from "@bufbuild/protobuf";
import {
  type CreateCompletionRequest,
  CreateCompletionRequestSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { invalidRequest } from "../../core/errors/index.js";
import { type JsonArrayCap, parseStrictJson, parseStrictJsonAsync } from "../../core/json/strict-json.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../../service/checks.js";
import type { RequestInit } from "./decode-openai-forms.js";
import { fieldReadersOf } from "./descriptor-readers.js";
import { isObject } from "./read-json-values.js";
import { decoderForms } from "./rest-json-forms.js";
import { walkObject } from "./walk-object.js";

/** A REST completion request, decoded: the proto request, and whether `stream: true` was sent. */
export interface DecodedCompletionRequest {
  readonly request: CreateCompletionRequest;
  /** `stream` of the body (false when left out or null); selects StreamCompletion. */
  readonly stream: boolean;
}

/**
 * The body's fields, by REST JSON name: every field of CreateCompletionRequest (proto/API.md §2),
 * plus `stream` (it selects the RPC). Built once, when this module loads.
 */
const requestFields = fieldReadersOf(CreateCompletionRequestSchema, decoderForms);

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
  const { stream = false, ...init } = walkObject(json, "", requestFields) as RequestInit & {
    stream?: boolean;
  };
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
