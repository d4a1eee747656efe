// THE table of REST's JSON forms beyond proto JSON (proto/API.md §2), the one place that states
// them: both the strict decoder (src/surfaces/rest/decode-completion-request.ts, through
// src/surfaces/rest/descriptor-readers.ts) and the OpenAPI document (src/surfaces/rest/openapi-request-schemas.ts,
// through src/surfaces/rest/openapi-from-proto.ts) read it. Every other request field is read, and stated,
// from its descriptor alone: a plain scalar or list-of-scalars field added to the proto needs
// nothing here.
//
// The forms: `prompt` as a string, strings, token ids or lists of token ids (the oneof's members,
// each wrapper message written as its list); `stop` as one string or a list; `priority` as an
// integer or a string holding one; `output_residual_stream` as a list of layer indices or `true`;
// a tensor as nested arrays or vllm-lens's encoded object; and `stream`, a REST-only field (it
// selects the RPC).
import type { DescMessage } from "@bufbuild/protobuf";
import { readOutputResidualStream, readPriority, readPrompt, readStop } from "./decode-openai-forms.js";
import { readTensor } from "./decode-steering-vectors.js";
import type { DecoderForms, RestOnlyField } from "./descriptor-readers.js";
import { fieldSchema, type ProtoSchemaTable } from "./openapi-from-proto.js";
import { type JsonSchema, ref } from "./openapi-json-schema.js";
import { readBoolean } from "./read-json-values.js";
import type { ValueReader } from "./walk-object.js";

/** A form of a field (or oneof): how the decoder reads it, how the OpenAPI document states it. */
interface MemberForm {
  readonly read: ValueReader;
  /** The schema, from the one generated from the descriptor; left out: the generated one. */
  readonly schema?: (generated: JsonSchema) => JsonSchema;
}

/** A form of a message, wherever a field has its type (a decoder's reader, if it reaches one). */
interface MessageForm {
  readonly read?: ValueReader;
  readonly schema: (message: DescMessage, table: ProtoSchemaTable) => JsonSchema;
}

type RestOnly = RestOnlyField & { readonly schema: JsonSchema };

/** The field of `message` named `name` (a descriptor this table was written for has it). */
function fieldNamed(message: DescMessage, name: string) {
  const field = message.fields.find((f) => f.name === name);
  if (field === undefined) throw new Error(`${message.typeName} has no field ${name}`);
  return field;
}

/** A message of one list `values` (PromptTexts, PromptTokenIds, …): REST writes the list alone. */
const theList: MessageForm["schema"] = (message, table) => fieldSchema(fieldNamed(message, "values"), table);

/** A steering vector's tensor: nested arrays, or vllm-lens's encoded object (src/lens/tensor-json.ts). */
const tensor: JsonSchema = {
  description:
    "A tensor (proto/API.md §6): plain nested number arrays (2D or 3D, rectangular, finite, float32 range), or the vllm-lens encoded object. bf16 travels as int16 bits.",
  oneOf: [
    {
      title: "nested arrays",
      type: "array",
      items: {
        type: "array",
        items: { anyOf: [{ type: "number" }, { type: "array", items: { type: "number" } }] },
      },
    },
    ref("EncodedTensor"),
  ],
};

/** Fields (and oneofs), by `Message.member` full name. */
const memberForms: Readonly<Record<string, MemberForm>> = {
  "acs.v1.CreateCompletionRequest.prompt": { read: readPrompt },
  "acs.v1.CreateCompletionRequest.stop": {
    read: readStop,
    schema: (list) => ({ oneOf: [list.items, list] }),
  },
  "acs.v1.CreateCompletionRequest.priority": {
    read: readPriority,
    schema: (int32) => ({ oneOf: [int32, { type: "string", pattern: "^-?[0-9]+$" }] }),
  },
};

/** Messages, by full name. */
const messageForms: Readonly<Record<string, MessageForm>> = {
  "acs.v1.PromptTexts": { schema: theList },
  "acs.v1.PromptTokenIds": { schema: theList },
  "acs.v1.PromptTokenIdsList": { schema: theList },
  "acs.v1.OutputResidualStream": {
    read: readOutputResidualStream,
    schema: (message, table) => ({
      oneOf: [fieldSchema(fieldNamed(message, "layer_indices"), table), { const: true }],
    }),
  },
  "acs.v1.Tensor": { read: readTensor, schema: () => tensor },
};

/** REST-only fields, by message full name. */
const restOnlyFields: Readonly<Record<string, readonly RestOnly[]>> = {
  "acs.v1.CreateCompletionRequest": [
    {
      name: "stream",
      before: "stream_options",
      read: readBoolean,
      schema: {
        type: "boolean",
        default: false,
        description: "`true`: the answer is a `text/event-stream` of chunks.",
      },
    },
  ],
};

const mapValues = <T, U>(record: Readonly<Record<string, T>>, pick: (value: T) => U | undefined) =>
  Object.fromEntries(
    Object.entries(record).flatMap(([name, value]): [string, U][] => {
      const picked = pick(value);
      return picked === undefined ? [] : [[name, picked]];
    }),
  );

/** The table as the decoder reads it (src/surfaces/rest/descriptor-readers.ts). */
export const decoderForms: DecoderForms = {
  members: mapValues(memberForms, (form) => form.read),
  messages: mapValues(messageForms, (form) => form.read),
  extra: restOnlyFields,
};

/** The table as the OpenAPI document states it (src/surfaces/rest/openapi-from-proto.ts). */
export const openApiForms: Required<Pick<ProtoSchemaTable, "messageForms" | "fieldForms" | "extra">> = {
  messageForms: mapValues(messageForms, (form) => form.schema),
  fieldForms: mapValues(memberForms, (form) => form.schema),
  extra: mapValues(restOnlyFields, (fields) =>
    fields.map(({ name, before, schema }) => ({ name, before, schema })),
  ),
};
