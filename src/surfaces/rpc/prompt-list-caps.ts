// §3 in protobuf JSON: a CreateCompletionRequest's prompt list longer than any size cap allows is
// refused while its Connect JSON is parsed, as REST refuses its `prompt` list (PROMPT_LIST_CAP).
import type { DescMessage } from "@bufbuild/protobuf";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import type { JsonArrayCap } from "../../core/json/strict-json.js";
import { maxPromptsPerRequest, tooManyPrompts } from "../../service/checks.js";

const fields = CreateCompletionRequestSchema.field;

/** `texts.values` and `tokenIdsList.values`, under each JSON name protobuf JSON accepts. */
const PROTO_PROMPT_LIST_CAPS: readonly JsonArrayCap[] = [fields.texts, fields.tokenIdsList].flatMap((field) =>
  [...new Set([field.jsonName, field.name])].map((name) => ({
    path: [name, "values"],
    maxItems: maxPromptsPerRequest,
    refuse: tooManyPrompts,
  })),
);

/** The array caps of `desc`'s JSON: the prompt lists of a completion request; else none. */
export function jsonArrayCapsOf(desc: DescMessage): readonly JsonArrayCap[] {
  return desc.typeName === CreateCompletionRequestSchema.typeName ? PROTO_PROMPT_LIST_CAPS : [];
}
