// JSON Schemas of request messages, generated from their proto descriptors (gen/acs/v1) and their
// protovalidate rules (buf.validate field options), for the OpenAPI document (src/surfaces/rest/openapi.ts).
//
// What the descriptor says is read from it: the REST JSON name of each field (its proto name, or
// its oneof's), its type, presence and repetition, enum values, and the ranges and lengths of its
// rules. What it does not carry comes from a table (`ProtoSchemaTable`): descriptions and defaults
// (buf's generated descriptors keep no comments), and REST's own JSON forms of some messages and
// fields (src/surfaces/rest/rest-json-forms.ts, the table the decoder reads too). A rule this file cannot
// state in JSON Schema makes the build throw, so that no constraint of the proto is silently left
// out of the document.
import {
  type DescField,
  type DescMessage,
  type DescOneof,
  getOption,
  isFieldSet,
  type Message,
  ScalarType,
} from "@bufbuild/protobuf";
import { FeatureSet_FieldPresence } from "@bufbuild/protobuf/wkt";
import {
  type FieldRules,
  FieldRulesSchema,
  field as fieldRulesOption,
  oneof as oneofRulesOption,
  type RepeatedRules,
} from "@bufbuild/protovalidate/gen/buf/validate/validate_pb.js";
import { type JsonSchema, orNull, ref } from "./openapi-json-schema.js";

/** What the descriptor does not say: descriptions, defaults and REST's own JSON forms. */
export interface ProtoSchemaTable {
  /** Message full name (`acs.v1.SteeringVector`) → the component schema it is (a `$ref`). */
  readonly components: Readonly<Record<string, string>>;
  /** Message full name → its REST JSON, built from its descriptor and this table (instead of an object). */
  readonly messageForms: Readonly<
    Record<string, (message: DescMessage, table: ProtoSchemaTable) => JsonSchema>
  >;
  /** `Message.field` full name → the field's REST JSON, built from the schema generated for it. */
  readonly fieldForms: Readonly<Record<string, (generated: JsonSchema) => JsonSchema>>;
  /** Message full name → fields REST takes beyond the proto, each placed before `before`. */
  readonly extra?: Readonly<Record<string, readonly RestOnlyFieldSchema[]>>;
  /** Message full name → what its comments say. */
  readonly docs: Readonly<Record<string, MessageDocs>>;
}

/** A field REST takes beyond the proto: its schema, placed before the field named `before`. */
export interface RestOnlyFieldSchema {
  readonly name: string;
  readonly before: string;
  readonly schema: JsonSchema;
}

/** A message's description, and its fields' (by REST JSON name). */
export interface MessageDocs {
  readonly description?: string;
  readonly fields?: Readonly<Record<string, FieldDocs>>;
}

/** A field's description and default (the value a field left out gets). */
export interface FieldDocs {
  readonly description?: string;
  readonly default?: unknown;
}

/** A field of a message, or one of its oneofs: one property of the REST JSON. */
type Member =
  | { readonly kind: "field"; readonly desc: DescField }
  | { readonly kind: "oneof"; readonly desc: DescOneof };

/** Bounds of the integer types that a double holds exactly; the 64-bit ones have none here. */
const integerBounds: Partial<Record<ScalarType, readonly [number, number]>> = {
  [ScalarType.INT32]: [-(2 ** 31), 2 ** 31 - 1],
  [ScalarType.SINT32]: [-(2 ** 31), 2 ** 31 - 1],
  [ScalarType.SFIXED32]: [-(2 ** 31), 2 ** 31 - 1],
  [ScalarType.UINT32]: [0, 2 ** 32 - 1],
  [ScalarType.FIXED32]: [0, 2 ** 32 - 1],
};

/**
 * The object schema of `message`: every field under its REST JSON name (a oneof under its own
 * name), `additionalProperties: false`, `required` those a request cannot leave out, every other
 * one also `null` (left out), plus the table's REST-only fields.
 *
 * @throws Error when a field has a protovalidate rule that has no JSON Schema form here
 */
export function messageObjectSchema(message: DescMessage, table: ProtoSchemaTable): JsonSchema {
  const docs = table.docs[message.typeName];
  const properties: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const member of membersOf(message)) {
    const name = member.desc.name;
    for (const extra of table.extra?.[message.typeName] ?? []) {
      if (extra.before === name) properties[extra.name] = orNull(extra.schema);
    }
    const schema = { ...memberSchema(member, table), ...docs?.fields?.[name] };
    if (isRequired(member)) required.push(name);
    properties[name] = isRequired(member) ? schema : orNull(schema);
  }
  return {
    type: "object",
    ...(docs?.description === undefined ? {} : { description: docs.description }),
    ...(required.length === 0 ? {} : { required }),
    additionalProperties: false,
    properties,
  };
}

/** The fields of `message` in declaration order, each oneof once (where its first field is). */
function membersOf(message: DescMessage): Member[] {
  const members: Member[] = [];
  for (const field of message.fields) {
    if (field.oneof === undefined) members.push({ kind: "field", desc: field });
    else if (field.oneof.fields[0] === field) members.push({ kind: "oneof", desc: field.oneof });
  }
  return members;
}

function memberSchema(member: Member, table: ProtoSchemaTable): JsonSchema {
  if (member.kind === "oneof") return { oneOf: member.desc.fields.map((field) => fieldSchema(field, table)) };
  return fieldSchema(member.desc, table);
}

/** Whether a request must carry `member`: its rules refuse it left out (the proto's zero value). */
function isRequired(member: Member): boolean {
  if (member.kind === "oneof") return getOption(member.desc, oneofRulesOption).required;
  const field = member.desc;
  const rules = getOption(field, fieldRulesOption);
  if (rules.required) return true;
  if (field.fieldKind === "list")
    return rules.type.case === "repeated" && (rules.type.value.minItems ?? 0n) > 0n;
  // A field with presence is checked only when set; one without is checked at its zero value.
  if (field.presence !== FeatureSet_FieldPresence.IMPLICIT) return false;
  return rules.type.case === "string" && (rules.type.value.minLen ?? 0n) > 0n;
}

/**
 * The schema of one field's value (a list: the array), its rules applied, then the table's REST
 * form of the field if it has one.
 *
 * @throws Error when a rule of the field has no JSON Schema form here
 */
export function fieldSchema(field: DescField, table: ProtoSchemaTable): JsonSchema {
  const rules = getOption(field, fieldRulesOption);
  assertStated(rules, ["required", "type"], field.toString());
  let schema: JsonSchema;
  if (field.fieldKind === "map") {
    throw new Error(`${field.toString()}: a map has no REST form (src/surfaces/rest/openapi-from-proto.ts)`);
  } else if (field.fieldKind === "list") {
    schema = listSchema(field, rules.type.case === "repeated" ? rules.type.value : undefined, table);
  } else {
    schema = valueSchema(field, rules, table, field.toString());
  }
  const form = table.fieldForms[`${field.parent.typeName}.${field.name}`];
  return form === undefined ? schema : form(schema);
}

function listSchema(
  field: Extract<DescField, { fieldKind: "list" }>,
  rules: RepeatedRules | undefined,
  table: ProtoSchemaTable,
): JsonSchema {
  const where = field.toString();
  const schema: JsonSchema = { type: "array" };
  if (rules === undefined)
    return { ...schema, items: valueSchema(field, undefined, table, `${where} items`) };
  assertStated(rules, ["minItems", "maxItems", "unique", "items"], where);
  if (rules.items !== undefined) assertStated(rules.items, ["type"], `${where} items`);
  schema.items = valueSchema(field, rules.items, table, `${where} items`);
  const minItems = ruleSet(rules, "minItems");
  const maxItems = ruleSet(rules, "maxItems");
  if (minItems !== undefined) schema.minItems = Number(minItems);
  if (maxItems !== undefined) schema.maxItems = Number(maxItems);
  if (rules.unique) schema.uniqueItems = true;
  return schema;
}

/** One value of `field` (of a list: one item), by its type, with its rules (`rules.type`) applied. */
function valueSchema(
  field: DescField,
  rules: FieldRules | undefined,
  table: ProtoSchemaTable,
  where: string,
): JsonSchema {
  const typed = rules?.type;
  if (field.fieldKind === "message" || (field.fieldKind === "list" && field.listKind === "message")) {
    if (typed?.case !== undefined) assertStated(typed.value, [], where);
    return messageValueSchema(field.message, table);
  }
  if (field.fieldKind === "enum" || (field.fieldKind === "list" && field.listKind === "enum")) {
    // `defined_only`: the schema lists the defined values only.
    if (typed?.case !== undefined) assertStated(typed.value, ["definedOnly"], where);
    return { enum: field.enum.values.map((value) => value.name) };
  }
  if (field.fieldKind === "scalar" || field.fieldKind === "list")
    return scalarSchema(field.scalar, rules, where);
  throw new Error(`${where}: no REST form (src/surfaces/rest/openapi-from-proto.ts)`);
}

/** A message-typed value: the table's REST form, a `$ref` to its component, or the object inline. */
function messageValueSchema(message: DescMessage, table: ProtoSchemaTable): JsonSchema {
  const form = table.messageForms[message.typeName];
  if (form !== undefined) return form(message, table);
  const component = table.components[message.typeName];
  return component === undefined ? messageObjectSchema(message, table) : ref(component);
}

/** A scalar's JSON type, with the bounds of its type and the ranges or lengths of its rules. */
function scalarSchema(scalar: ScalarType, rules: FieldRules | undefined, where: string): JsonSchema {
  const typed = rules?.type;
  switch (scalar) {
    case ScalarType.BOOL:
      if (typed?.case !== undefined) assertStated(typed.value, [], where);
      return { type: "boolean" };
    case ScalarType.STRING:
      return stringSchema(typed?.case === "string" ? typed.value : undefined, where);
    case ScalarType.BYTES:
      if (typed?.case !== undefined) assertStated(typed.value, [], where);
      return { type: "string", contentEncoding: "base64" };
    default:
      return numberSchema(scalar, typed?.value as NumericRules | undefined, where);
  }
}

function stringSchema(
  rules: Extract<FieldRules["type"], { case: "string" }>["value"] | undefined,
  where: string,
) {
  const schema: JsonSchema = { type: "string" };
  if (rules === undefined) return schema;
  assertStated(rules, ["minLen", "maxLen", "example"], where);
  const minLen = ruleSet(rules, "minLen");
  const maxLen = ruleSet(rules, "maxLen");
  if (minLen !== undefined) schema.minLength = Number(minLen);
  if (maxLen !== undefined) schema.maxLength = Number(maxLen);
  return schema;
}

/** What the numeric rules (int32, double, …) have in common: a lower and an upper bound. */
interface NumericRules extends Message {
  readonly greaterThan:
    | { case: "gt" | "gte"; value: number | bigint }
    | { case: undefined; value?: undefined };
  readonly lessThan: { case: "lt" | "lte"; value: number | bigint } | { case: undefined; value?: undefined };
}

function numberSchema(scalar: ScalarType, rules: NumericRules | undefined, where: string): JsonSchema {
  const integer = scalar !== ScalarType.DOUBLE && scalar !== ScalarType.FLOAT;
  const schema: JsonSchema = { type: integer ? "integer" : "number" };
  const bounds = integerBounds[scalar];
  if (bounds !== undefined) [schema.minimum, schema.maximum] = bounds;
  if (rules === undefined) return schema;
  // `finite`: a JSON number is finite (src/core/json/strict-json.ts refuses one too large for a double).
  assertStated(rules, ["greaterThan", "lessThan", "finite", "example"], where);
  const { greaterThan: low, lessThan: high } = rules;
  if (low.case !== undefined) {
    delete schema.minimum;
    schema[low.case === "gte" ? "minimum" : "exclusiveMinimum"] = Number(low.value);
  }
  if (high.case !== undefined) {
    delete schema.maximum;
    schema[high.case === "lte" ? "maximum" : "exclusiveMaximum"] = Number(high.value);
  }
  return schema;
}

/**
 * Throws when `rules` sets a rule other than `stated` (by field or oneof name): one this file does
 * not put into the schema.
 */
function assertStated(rules: Message, stated: readonly string[], where: string): void {
  for (const field of rulesSchemaOf(rules).fields) {
    const name = field.oneof?.localName ?? field.localName;
    if (!stated.includes(name) && isFieldSet(rules as never, field)) {
      throw new Error(
        `${where}: the protovalidate rule ${field.name} has no OpenAPI form (src/surfaces/rest/openapi-from-proto.ts)`,
      );
    }
  }
}

/** The value of the rule `name` of `rules` when it is set; else undefined (not its default). */
function ruleSet<T extends Message, K extends keyof T & string>(rules: T, name: K): T[K] | undefined {
  const field = rulesSchemaOf(rules).fields.find((f) => f.localName === name);
  return field !== undefined && isFieldSet(rules as never, field) ? rules[name] : undefined;
}

/** FieldRules and the rule messages of its `type` oneof (StringRules, Int32Rules, …), by full name. */
const ruleMessages = new Map<string, DescMessage>([
  [FieldRulesSchema.typeName, FieldRulesSchema],
  ...FieldRulesSchema.fields.flatMap((field): [string, DescMessage][] =>
    field.oneof?.name === "type" && field.message !== undefined
      ? [[field.message.typeName, field.message]]
      : [],
  ),
]);

/** The descriptor of a rules message (FieldRules, StringRules, …). */
function rulesSchemaOf(rules: Message): DescMessage {
  const desc = ruleMessages.get(rules.$typeName);
  if (desc === undefined) throw new Error(`unknown protovalidate rules ${rules.$typeName}`);
  return desc;
}
