import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  type DetokenizeRequest,
  DetokenizeRequestSchema,
  type TokenizeRequest,
  TokenizeRequestSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { invalidRequest } from "../errors/index.js";
import { isObject, readBoolean, readInt32Array, readString } from "./read-json-values.js";
import { parseStrictJsonAsync } from "./strict-json.js";
import { type FieldReader, walkObject } from "./walk-object.js";

type Init<Desc extends typeof TokenizeRequestSchema | typeof DetokenizeRequestSchema> = Exclude<
  MessageInitShape<Desc>,
  TokenizeRequest | DetokenizeRequest
>;
type TokenizeInit = Init<typeof TokenizeRequestSchema>;
type DetokenizeInit = Init<typeof DetokenizeRequestSchema>;

const tokenizeFields = new Map<string, FieldReader<TokenizeInit>>([
  ["model", (v, p) => ({ model: readString(v, p) })],
  ["prompt", (v, p) => ({ prompt: readString(v, p) })],
  ["add_special_tokens", (v, p) => ({ addSpecialTokens: readBoolean(v, p) })],
  ["return_token_strs", (v, p) => ({ returnTokenStrs: readBoolean(v, p) })],
]);

const detokenizeFields = new Map<string, FieldReader<DetokenizeInit>>([
  ["model", (v, p) => ({ model: readString(v, p) })],
  ["tokens", (v, p) => ({ tokens: readInt32Array(v, p) })],
]);

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
