// A plain request field added to the proto needs nothing in src/surfaces/rest (issue 34): every scalar and
// list-of-scalars field of the request messages is read by the REST decoders (into the proto
// field) and stated by the OpenAPI document, from its descriptor alone (src/surfaces/rest/descriptor-readers.ts,
// src/surfaces/rest/openapi-from-proto.ts); and a field no reader can read fails the build instead of
// being left unread.
import { create, createFileRegistry, type DescField, type DescMessage, ScalarType } from "@bufbuild/protobuf";
import {
  FileDescriptorProtoSchema,
  FieldDescriptorProto_Label as Label,
  FieldDescriptorProto_Type as Type,
} from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import {
  CreateCompletionRequestSchema,
  DetokenizeRequestSchema,
  StreamOptionsSchema,
  TokenizeRequestSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { SteeringVectorSchema, TensorSchema } from "../../../gen/acs/v1/lens_pb.js";
import { ApiError } from "../../../src/core/errors/index.js";
import { parseStrictJson } from "../../../src/core/json/strict-json.js";
import { decodeCompletionRequest } from "../../../src/surfaces/rest/decode-completion-request.js";
import {
  decodeDetokenizeRequest,
  decodeTokenizeRequest,
} from "../../../src/surfaces/rest/decode-tokens-request.js";
import { fieldReadersOf } from "../../../src/surfaces/rest/descriptor-readers.js";
import { type JsonSchema, openApiDocument } from "../../../src/surfaces/rest/openapi.js";
import { decoderForms } from "../../../src/surfaces/rest/rest-json-forms.js";
import { walkObject } from "../../../src/surfaces/rest/walk-object.js";

type PlainField = DescField & { fieldKind: "scalar" | "list"; scalar: ScalarType };

/** The fields of `message` that are a scalar or a list of scalars, outside any oneof. */
const plainFieldsOf = (message: DescMessage) =>
  message.fields.filter(
    (field): field is PlainField =>
      field.oneof === undefined &&
      (field.fieldKind === "scalar" || (field.fieldKind === "list" && field.listKind === "scalar")),
  );

/** A JSON text of one value of `scalar`, and the value the proto field then holds. */
function sampleOf(scalar: ScalarType): { json: string; value: unknown; type: string } {
  switch (scalar) {
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return { json: "0.5", value: 0.5, type: "number" };
    case ScalarType.BOOL:
      return { json: "true", value: true, type: "boolean" };
    case ScalarType.STRING:
      return { json: '"s"', value: "s", type: "string" };
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      // Beyond 2^53: kept exact, never through a double.
      return { json: "9007199254740993", value: 9007199254740993n, type: "integer" };
    default:
      return { json: "3", value: 3, type: "integer" };
  }
}

/** The field's JSON sample (a list: two items) and what the decoded proto field holds. */
function sample(field: PlainField): { json: string; value: unknown; type: string } {
  const one = sampleOf(field.scalar);
  if (field.fieldKind === "scalar") return one;
  return { json: `[${one.json},${one.json}]`, value: [one.value, one.value], type: "array" };
}

/** A completion body with `json` under `name`, and a model and a prompt (unless `name` is one). */
const completionBody = (name: string, json: string) =>
  `{${[`"model":"m"`, `"prompt":"p"`].filter((entry) => !entry.startsWith(`"${name}"`)).join(",")},"${name}":${json}}`;

/** Each message REST decodes, how a body carrying `json` under `name` is decoded, and where its fields land. */
const surfaces: {
  message: DescMessage;
  decode: (name: string, json: string) => Promise<Record<string, unknown>>;
}[] = [
  {
    message: CreateCompletionRequestSchema,
    decode: async (name, json) => decodeCompletionRequest(completionBody(name, json)).request as never,
  },
  {
    message: StreamOptionsSchema,
    decode: async (name, json) =>
      decodeCompletionRequest(`{"model":"m","prompt":"p","stream_options":{"${name}":${json}}}`).request
        .streamOptions as never,
  },
  {
    message: SteeringVectorSchema,
    decode: async (name, json) =>
      decodeCompletionRequest(
        `{"model":"m","prompt":"p","apply_steering_vectors":[{"activations":[[1]],"${name}":${json}}]}`,
      ).request.applySteeringVectors[0] as never,
  },
  {
    message: TokenizeRequestSchema,
    decode: async (name, json) =>
      (await decodeTokenizeRequest(new TextEncoder().encode(`{"${name}":${json}}`))) as never,
  },
  {
    message: DetokenizeRequestSchema,
    decode: async (name, json) =>
      (await decodeDetokenizeRequest(new TextEncoder().encode(`{"${name}":${json}}`))) as never,
  },
];

describe("request fields come from the proto descriptors alone", () => {
  it("finds the plain fields it checks (the request's sampling fields among them)", () => {
    const names = plainFieldsOf(CreateCompletionRequestSchema).map((field) => field.name);
    expect(names).toEqual(expect.arrayContaining(["max_tokens", "temperature", "seed", "stop_token_ids"]));
  });

  for (const { message, decode } of surfaces) {
    it(`every scalar or list-of-scalars field of ${message.typeName} is read into its proto field`, async () => {
      for (const field of plainFieldsOf(message)) {
        const { json, value } = sample(field);
        const decoded = await decode(field.name, json).catch((err: unknown) => err);
        expect(decoded instanceof ApiError ? `${field.name}: ${decoded.message}` : field.name).toBe(
          field.name,
        );
        expect([field.name, (decoded as Record<string, unknown>)[field.localName]]).toStrictEqual([
          field.name,
          value,
        ]);
        // A wrong type is refused under the field's name (dotted inside a nested message).
        const wrong = field.scalar === ScalarType.STRING ? "{}" : '"text"';
        const refused = await decode(field.name, wrong).catch((err: unknown) => err);
        expect(refused).toBeInstanceOf(ApiError);
        expect((refused as ApiError).param?.endsWith(field.name)).toBe(true);
      }
    });
  }

  it("every such field of the completion request is a property of the OpenAPI CompletionRequest, typed as the decoder reads it", () => {
    const properties = openApiDocument.components.schemas.CompletionRequest?.properties as Record<
      string,
      JsonSchema
    >;
    for (const field of plainFieldsOf(CreateCompletionRequestSchema)) {
      const property = properties[field.name] as { anyOf?: JsonSchema[] } | undefined;
      // Optional fields are `anyOf: [schema, null]`; a REST form is `oneOf` its forms.
      const schema = (property?.anyOf?.[0] ?? property) as { type?: string; oneOf?: { type?: string }[] };
      const types = schema?.oneOf?.map((form) => form.type) ?? [schema?.type];
      expect([field.name, types]).toStrictEqual([field.name, expect.arrayContaining([sample(field).type])]);
    }
  });

  it("a field no reader takes (bytes, an enum) or a oneof without a form fails the build", () => {
    const noForms = { members: {}, messages: {}, extra: {} };
    expect(() => fieldReadersOf(TensorSchema, noForms)).toThrow(/has no REST reader/);
    expect(() => fieldReadersOf(CreateCompletionRequestSchema, noForms)).toThrow(
      /CreateCompletionRequest\.prompt: a oneof has no REST reader/,
    );
  });
});

/** A message of fields of the types the request protos do not use yet, as a proto could add them. */
function newFieldsMessage(): DescMessage {
  const fields: [string, Type, Label][] = [
    ["u32", Type.UINT32, Label.OPTIONAL],
    ["u64", Type.UINT64, Label.OPTIONAL],
    ["f", Type.FLOAT, Label.OPTIONAL],
    ["words", Type.STRING, Label.REPEATED],
    ["flags", Type.BOOL, Label.REPEATED],
    ["weights", Type.DOUBLE, Label.REPEATED],
    ["big", Type.INT64, Label.REPEATED],
  ];
  const file = create(FileDescriptorProtoSchema, {
    name: "t/new_fields.proto",
    package: "t",
    syntax: "proto3",
    messageType: [
      {
        name: "NewFields",
        field: fields.map(([name, type, label], index) => ({ name, number: index + 1, type, label })),
      },
    ],
  });
  const message = createFileRegistry(file, () => undefined).getMessage("t.NewFields");
  if (message === undefined) throw new Error("t.NewFields not built");
  return message;
}

describe("a field of any scalar type a proto could add is read from its descriptor", () => {
  const message = newFieldsMessage();
  const readers = fieldReadersOf(message, decoderForms);
  const decode = (json: string) => create(message, walkObject(parseStrictJson(json) as never, "", readers));
  const refusal = (json: string) => {
    try {
      decode(json);
    } catch (err) {
      if (err instanceof ApiError) return [err.param, err.message];
      throw err;
    }
    return undefined;
  };

  it("reads each type exactly into its field", () => {
    // uint64 up to 19 digits: strict-json reads no longer integer exactly (as Connect's check).
    const read = decode(
      '{"u32":4294967295,"u64":9999999999999999999,"f":1.5,"words":["a","b"],"flags":[true,false],"weights":[1,0.5],"big":[-9223372036854775808,2.0]}',
    ) as unknown as Record<string, unknown>;
    expect(read).toMatchObject({
      u32: 4294967295,
      u64: 9999999999999999999n,
      f: 1.5,
      words: ["a", "b"],
      flags: [true, false],
      weights: [1, 0.5],
      big: [-9223372036854775808n, 2n],
    });
  });

  it("refuses a wrong type or an out-of-range value as the request's fields are refused", () => {
    const cases: [body: string, param: string, message: string][] = [
      // Lists in protobuf JSON's words, as Connect JSON reads them: the item is named.
      ['{"words":"a"}', "words", "Invalid type for 'words': expected an array."],
      ['{"words":["a",1]}', "words[1]", "Invalid type for 'words[1]': expected a string."],
      ['{"words":["a",null]}', "words[1]", "Invalid value for 'words[1]': a list item cannot be null."],
      ['{"flags":[true,1]}', "flags[1]", "Invalid type for 'flags[1]': expected a boolean."],
      ['{"weights":[1,"1"]}', "weights[1]", "Invalid type for 'weights[1]': expected a number."],
      ['{"big":[1,2.5]}', "big[1]", "Invalid type for 'big[1]': expected an integer."],
      ['{"f":3.5e38}', "f", "Invalid value for 'f': the number is too large."],
      ['{"u32":-1}', "u32", "Invalid value for 'u32': expected an integer from 0 to 4294967295 (uint32)."],
      [
        '{"u64":18446744073709551616}',
        "u64",
        "Invalid value for 'u64': expected an integer from 0 to 18446744073709551615 (uint64).",
      ],
      // Types before ranges: the range refusal of an item waits for the next items' types, and
      // for the other fields'.
      ['{"weights":[1e999,"x"]}', "weights[1]", "Invalid type for 'weights[1]': expected a number."],
      ['{"weights":[1e999],"words":[1]}', "words[0]", "Invalid type for 'words[0]': expected a string."],
      ['{"weights":[1,1e999]}', "weights[1]", "Invalid value for 'weights[1]': the number is too large."],
      ['{"apply_hooks":["x"]}', "apply_hooks", "Unrecognized request argument supplied: apply_hooks"],
    ];
    for (const [body, param, message] of cases) expect(refusal(body)).toStrictEqual([param, message]);
  });
});
