// REST's strict decoders of vLLM's `POST /tokenize` and `POST /detokenize` bodies: the fields of
// TokenizeRequest and DetokenizeRequest, read from their descriptors as a completion's are
// (src/surfaces/rest/descriptor-readers.ts); neither has a form beyond proto JSON.
import { create } from "@bufbuild/protobuf";
import {
  type DetokenizeRequest,
  DetokenizeRequestSchema,
  type TokenizeRequest,
  TokenizeRequestSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { invalidRequest } from "../../core/errors/index.js";
import { parseStrictJsonAsync } from "../../core/json/strict-json.js";
import { fieldReadersOf } from "./descriptor-readers.js";
import { isObject } from "./read-json-values.js";
import { decoderForms } from "./rest-json-forms.js";
import { walkObject } from "./walk-object.js";

const tokenizeFields = fieldReadersOf(TokenizeRequestSchema, decoderForms);
const detokenizeFields = fieldReadersOf(DetokenizeRequestSchema, decoderForms);

/** The JSON names of the fields `POST /tokenize` takes (vLLM's TokenizeCompletionRequest). */
export const tokenizeRequestFieldNames: readonly string[] = [...tokenizeFields.keys()];
/** The JSON names of the fields `POST /detokenize` takes (vLLM's DetokenizeRequest). */
export const detokenizeRequestFieldNames: readonly string[] = [...detokenizeFields.keys()];

async function parseObject(body: Uint8Array): Promise<Record<string, unknown>> {
  const json = await parseStrictJsonAsync(body);
  if (!isObject(json)) throw invalidRequest(null, "The request body must be a JSON object.");
  return json;
}

/**
 * Decodes the body of `POST /tokenize` strictly into the proto request, as a completion's body is
 * decoded (proto/API.md §4): the same parser, unknown fields refused first (param = the field),
 * then each field's type (`Invalid type for 'prompt': expected a string.`); `null` = left out.
 * Required fields and ranges are the service's (protovalidate).
 *
 * @throws ApiError 400 `invalid_request`
 */
export async function decodeTokenizeRequest(body: Uint8Array): Promise<TokenizeRequest> {
  return create(TokenizeRequestSchema, walkObject(await parseObject(body), "", tokenizeFields));
}

/**
 * Decodes the body of `POST /detokenize` (`{model, tokens}`) as {@link decodeTokenizeRequest}
 * does; `tokens` is an array of integers, each within int32.
 *
 * @throws ApiError 400 `invalid_request`
 */
export async function decodeDetokenizeRequest(body: Uint8Array): Promise<DetokenizeRequest> {
  return create(DetokenizeRequestSchema, walkObject(await parseObject(body), "", detokenizeFields));
}
