// REST's strict readers of a request message's fields (proto/API.md §2, §4), built once from the
// message's descriptor (gen/acs/v1): every field under its proto (snake_case) name, read by its
// type into the message init under its localName. What proto JSON does not say — REST's own JSON
// forms and REST-only fields — comes from a table (`DecoderForms`, src/surfaces/rest/rest-json-forms.ts).
// A field this file has no reader for (bytes, an enum, a map, a oneof without a form) makes the
// build throw at module load, so that no field of the proto is silently left unread.
import { type DescField, type DescMessage, ScalarType } from "@bufbuild/protobuf";
import { INT64, type IntRange, invalidType, UINT32, UINT64 } from "../../core/json/decode-refusals.js";
import {
  isObject,
  readBoolean,
  readDouble,
  readFloat,
  readInt32,
  readInt32Array,
  readInteger,
  readListItems,
  readString,
} from "./read-json-values.js";
import { type FieldReader, type ValueReader, walkObject } from "./walk-object.js";

/** A field REST takes beyond the proto, placed before the field named `before`. */
export interface RestOnlyField {
  readonly name: string;
  readonly before: string;
  readonly read: ValueReader;
}

/** What the descriptors do not say: REST's own JSON forms, and its REST-only fields. */
export interface DecoderForms {
  /** `Message.member` full name (a field, or a oneof under its name) → the member's reader. */
  readonly members: Readonly<Record<string, ValueReader>>;
  /** Message full name → the reader of a value of that message, wherever a field has its type. */
  readonly messages: Readonly<Record<string, ValueReader>>;
  /** Message full name → its REST-only fields. */
  readonly extra: Readonly<Record<string, readonly RestOnlyField[]>>;
}

/** The readers of a message's fields, by REST JSON name (REST-only fields keyed by their name). */
export type FieldReaders = ReadonlyMap<string, FieldReader>;

/**
 * The readers of `message`'s fields by REST JSON name, in declaration order (a oneof once, where
 * it is declared; a REST-only field before its `before`); nested messages get theirs likewise.
 *
 * @throws Error when a field has no reader here and no form in `forms`
 */
export function fieldReadersOf(message: DescMessage, forms: DecoderForms): FieldReaders {
  return buildReaders(message, forms, new Map());
}

function buildReaders(
  message: DescMessage,
  forms: DecoderForms,
  built: Map<string, Map<string, FieldReader>>,
): FieldReaders {
  const done = built.get(message.typeName);
  if (done !== undefined) return done;
  const readers = new Map<string, FieldReader>();
  built.set(message.typeName, readers);
  const extra = forms.extra[message.typeName] ?? [];
  for (const member of message.members) {
    for (const field of extra) {
      if (field.before === member.name) readers.set(field.name, { key: field.name, read: field.read });
    }
    const form = forms.members[`${message.typeName}.${member.name}`];
    if (form !== undefined) readers.set(member.name, { key: member.localName, read: form });
    else if (member.kind === "oneof") throw noReader(`${message.typeName}.${member.name}`, "a oneof");
    else readers.set(member.name, { key: member.localName, read: fieldReader(member, forms, built) });
  }
  const misplaced = extra.find((field) => !readers.has(field.name));
  if (misplaced !== undefined) throw new Error(`${message.typeName} has no field ${misplaced.before}`);
  return readers;
}

function noReader(where: string, what: string): Error {
  return new Error(
    `${where}: ${what} has no REST reader (add its form to src/surfaces/rest/rest-json-forms.ts)`,
  );
}

/** The reader of one field's JSON value, by its kind and type. */
function fieldReader(
  field: DescField,
  forms: DecoderForms,
  built: Map<string, Map<string, FieldReader>>,
): ValueReader {
  const where = field.toString();
  switch (field.fieldKind) {
    case "scalar":
      return scalarReader(field.scalar, field.longAsString, where);
    case "message":
      return messageReader(field.message, forms, built);
    case "list":
      if (field.listKind === "scalar") return listReader(field.scalar, field.longAsString, where);
      if (field.listKind === "message") return messagesReader(messageReader(field.message, forms, built));
      throw noReader(where, "a list of enums");
    default:
      throw noReader(where, `a field of kind ${field.fieldKind}`);
  }
}

/** A message-typed value: its form in the table, else a JSON object walked by its fields. */
function messageReader(
  message: DescMessage,
  forms: DecoderForms,
  built: Map<string, Map<string, FieldReader>>,
): ValueReader {
  const form = forms.messages[message.typeName];
  if (form !== undefined) return form;
  const fields = buildReaders(message, forms, built);
  return (value, param) => {
    if (!isObject(value)) throw invalidType(param, "an object");
    return walkObject(value, `${param}.`, fields);
  };
}

/** A list of messages: an array, each item read as `param[i]` (a null item is not an object). */
function messagesReader(readItem: ValueReader): ValueReader {
  return (value, param) => readListItems(value, param, readItem, "read");
}

/**
 * An integer type's reader beyond int32: exact, within `range`; a bigint, or text (`jstype`). An
 * integer of more than 19 digits is out of range (src/core/json/strict-json.ts reads no longer one
 * exactly): a uint64 is read up to 9,999,999,999,999,999,999, as Connect's check reads it.
 */
function integerReader(range: IntRange, asNumber: boolean, asString: boolean): ValueReader {
  if (asNumber) return (value, param) => Number(readInteger(value, param, range));
  if (asString) return (value, param) => String(readInteger(value, param, range));
  return (value, param) => readInteger(value, param, range);
}

/** The range of a 64-bit or unsigned 32-bit integer type; undefined for the others. */
const integerRanges: Partial<Record<ScalarType, IntRange>> = {
  [ScalarType.UINT32]: UINT32,
  [ScalarType.FIXED32]: UINT32,
  [ScalarType.INT64]: INT64,
  [ScalarType.SINT64]: INT64,
  [ScalarType.SFIXED64]: INT64,
  [ScalarType.UINT64]: UINT64,
  [ScalarType.FIXED64]: UINT64,
};

/** One scalar value of a field (of a list: one item). */
function scalarReader(scalar: ScalarType, longAsString: boolean, where: string): ValueReader {
  switch (scalar) {
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return readInt32;
    case ScalarType.DOUBLE:
      return readDouble;
    case ScalarType.FLOAT:
      return readFloat;
    case ScalarType.BOOL:
      return readBoolean;
    case ScalarType.STRING:
      return readString;
    case ScalarType.BYTES:
      throw noReader(where, "a bytes field");
  }
  const range = integerRanges[scalar] as IntRange;
  return integerReader(range, range === UINT32, longAsString);
}

/**
 * A list of scalars: int32 lists as REST always read them ({@link readInt32Array}: `expected an
 * array of integers.`, param the field); any other in protobuf JSON's words, each item named by
 * its index, as Connect JSON reads them ({@link readListItems}).
 */
function listReader(scalar: ScalarType, longAsString: boolean, where: string): ValueReader {
  if (scalar === ScalarType.INT32 || scalar === ScalarType.SINT32 || scalar === ScalarType.SFIXED32) {
    return (value, param) => readInt32Array(value, param);
  }
  const readItem = scalarReader(scalar, longAsString, `${where} items`);
  return (value, param) => readListItems(value, param, readItem);
}
