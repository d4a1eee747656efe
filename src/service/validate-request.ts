import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { createValidator, type Violation } from "@bufbuild/protovalidate";
import {
  type CreateCompletionRequest,
  CreateCompletionRequestSchema,
  type DetokenizeRequest,
  DetokenizeRequestSchema,
  type TokenizeRequest,
  TokenizeRequestSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { ApiError, invalidRequest } from "../core/errors/index.js";

const validator = createValidator();

/** Cross-field (message-level CEL) rules name no field; this names the param they are about. */
const messageRuleParams: Record<string, string> = {
  "n.greedy": "n",
  "min_tokens.max_tokens": "min_tokens",
  "output_residual_stream.selection": "output_residual_stream",
};

/** Request fields whose every nested part is reported as the field itself. */
const wholeFields = new Set([
  "text",
  "texts",
  "token_ids",
  "token_ids_list",
  "output_residual_stream",
  "stop",
  "stop_token_ids",
]);
const promptMembers = new Set(["text", "texts", "token_ids", "token_ids_list"]);

/**
 * The API param of a protovalidate violation: the JSON field path callers sent, e.g. `max_tokens`,
 * `prompt` (for every prompt form), `apply_steering_vectors[1].layer_indices`,
 * `apply_steering_vectors[0].activations` (for anything inside a tensor).
 */
export function violationParam(v: Violation): string | null {
  const fields: string[] = [];
  let index: number | undefined;
  for (const seg of v.field) {
    if (seg.kind === "field" || seg.kind === "oneof") fields.push(seg.name);
    else if (seg.kind === "list_sub" && fields.length === 1 && index === undefined) index = seg.index;
  }
  const [first, second] = fields;
  if (first === undefined) {
    return messageRuleParams[v.ruleId] ?? null;
  }
  if (promptMembers.has(first)) return "prompt";
  if (wholeFields.has(first)) return first;
  if (first === "apply_steering_vectors") {
    const base = `apply_steering_vectors[${index ?? 0}]`;
    return second === undefined ? base : `${base}.${second}`;
  }
  return first;
}

/** protovalidate's message, in plainer words where it has stock phrasing. */
function ruleText(v: Violation): string {
  if (v.ruleId === "string.min_len" && v.message.endsWith(" 1 characters")) return "must not be empty";
  if (v.ruleId === "repeated.min_items" && v.message.endsWith(" 1 item(s)")) return "must not be empty";
  return v.message
    .replace(/\.$/, "")
    .replace(/\bitem\(s\)/g, "items")
    .replace(/\b1 characters\b/g, "1 character");
}

function describe(v: Violation, param: string | null): string {
  const rule = ruleText(v);
  return param === null ? `Invalid request: ${rule}.` : `Invalid value for '${param}': ${rule}.`;
}

/** The first protovalidate violation of `message`, or undefined; a rule that fails to evaluate is a 500. */
function firstViolation<Desc extends DescMessage>(
  schema: Desc,
  message: MessageShape<Desc>,
): Violation | undefined {
  const result = validator.validate(schema, message);
  if (result.kind === "valid") return undefined;
  if (result.kind === "error") {
    throw new ApiError("internal_error", "The server had an error while validating your request.", {
      cause: result.error,
    });
  }
  return result.violations[0] ?? fail(null, "Invalid request.");
}

function fail(param: string | null, message: string): never {
  throw invalidRequest(param, message);
}

/**
 * Checks the protovalidate rules of proto/acs/v1 (ranges, list sizes, cross-field rules) on a
 * request from either surface. Throws ApiError 400 `invalid_request` naming the first violated
 * field (param as callers spell it); a rule that fails to evaluate is a 500.
 */
export function validateRequest(request: CreateCompletionRequest): void {
  const first = firstViolation(CreateCompletionRequestSchema, request);
  if (first === undefined) return;
  const param = violationParam(first);
  // Connect cannot tell a missing model or prompt from an empty one; REST says the same.
  if (param === "model" && request.model === "") fail("model", "You must provide a model parameter.");
  if (param === "prompt" && request.prompt.case === undefined) fail("prompt", "You must provide a prompt.");
  throw invalidRequest(param, describe(first, param));
}

/**
 * {@link validateRequest} for a Tokenize or Detokenize request: the same envelope and words (a
 * missing model or prompt as a completion's; `tokens` as a token-id prompt's).
 */
export function validateTokensRequest(request: TokenizeRequest | DetokenizeRequest): void {
  const first =
    request.$typeName === "acs.v1.TokenizeRequest"
      ? firstViolation(TokenizeRequestSchema, request)
      : firstViolation(DetokenizeRequestSchema, request);
  if (first === undefined) return;
  const param = violationParam(first);
  if (param === "model" && request.model === "") fail("model", "You must provide a model parameter.");
  if (param === "prompt" && request.$typeName === "acs.v1.TokenizeRequest" && request.prompt === undefined)
    fail("prompt", "You must provide a prompt.");
  throw invalidRequest(param, describe(first, param));
}
