// Connect JSON read as strictly as REST's JSON (proto/API.md §1: nothing is validated in only one
// of the two paths): connect-es decodes a JSON message's bytes with the `textDecoder` of its
// `jsonOptions`, then hands the text to protobuf-es (JSON.parse).
import type { DescMessage } from "@bufbuild/protobuf";
import { ApiError } from "../../core/errors/index.js";
import {
  type JsonArrayCap,
  JsonNumberText,
  parseStrictJsonNoting,
  readExactIntegerText,
} from "../../core/json/strict-json.js";
import { carryRefusal } from "./carried-refusal.js";
import { checkProtoJson } from "./explain-proto-json.js";
import { jsonArrayCapsOf } from "./prompt-list-caps.js";

const utf8 = new TextDecoder();

/** Whether a parsed JSON value holds a number kept as its text (see {@link JsonNumberText}). */
function holdsNumberText(value: unknown): boolean {
  if (value instanceof JsonNumberText) return true;
  if (typeof value !== "object" || value === null) return false;
  if (Array.isArray(value)) {
    for (const item of value) if (typeof item === "object" && holdsNumberText(item)) return true;
    return false;
  }
  for (const key in value) {
    const item = (value as Record<string, unknown>)[key];
    if (typeof item === "object" && holdsNumberText(item)) return true;
  }
  return false;
}

/**
 * JSON.stringify's replacer: a number kept as its text becomes a JSON string — an integer's exact
 * decimal digits (`1e17`, `9007199254740993.0` → "100000000000000000", "9007199254740993": protobuf
 * JSON reads an int64 string as digits only), else the text as written (a double field reads it).
 */
const numberTextAsString = (_key: string, value: unknown): unknown => {
  if (!(value instanceof JsonNumberText)) return value;
  const exact = readExactIntegerText(value.text);
  return exact.kind === "integer" ? exact.value.toString() : value.text;
};

/**
 * The `textDecoder` of connect-es's `jsonOptions`: the bytes of a Connect JSON message (Connect,
 * gRPC-Web and gRPC JSON codecs) are first parsed as REST parses a body ({@link parseStrictJson}),
 * so that what REST refuses is refused here too — invalid UTF-8 (not replaced by U+FFFD), a byte
 * order mark, malformed JSON, a key repeated with another value, nesting deeper than 512 — and
 * what REST accepts is accepted: a key repeated with the same value is kept once, as on REST
 * (protobuf-es alone would refuse it), by handing protobuf-es the parsed value written out again.
 * The text protobuf-es then reads keeps every integer exact: a number JSON.parse would round
 * (`"seed": 9007199254740993`, `1e17`, an int64; proto/API.md §2 "never rounded through a double")
 * is passed on in a JSON string, which protobuf JSON reads for every numeric field: an integer as
 * its decimal digits, anything else as written. Other bodies are passed on as their UTF-8 text,
 * unchanged. A decoder that knows the message's type ({@link strictJsonTextDecoderFor}, the
 * completion methods') also checks each field as REST does: without the type, a 32-bit integer
 * field given a fraction whose double is an integer (`"n": 1.0000000000000000001`) would be read
 * as that integer, and an integer field's string as `Number()`/`BigInt()` read it.
 *
 * A refusal (ApiError 400 `invalid_request`, param null, REST's message) is thrown as a ConnectError
 * that carries it to the error envelopes (src/surfaces/rpc/carried-refusal.ts), which send it with the
 * call's request id: the body is not read again. Synchronous like connect-es's own JSON.parse: an 8 MiB body takes
 * about as long again (~0.1 s on the bench machine).
 */
export const strictJsonTextDecoder = {
  decode(input?: Uint8Array): string {
    return decodeStrictly(input ?? new Uint8Array(0), []);
  },
};

/** The text protobuf-es reads from `bytes` (see {@link strictJsonTextDecoder}); throws carried refusals. */
function decodeStrictly(bytes: Uint8Array, caps: readonly JsonArrayCap[], desc?: DescMessage): string {
  let parsed: unknown;
  let repeatedKey: boolean;
  try {
    ({ value: parsed, repeatedKey } = parseStrictJsonNoting(bytes, caps));
  } catch (err) {
    throw err instanceof ApiError ? carryRefusal(err) : err;
  }
  const fault = desc === undefined ? undefined : checkProtoJson(desc, parsed);
  if (fault !== undefined) throw carryRefusal(fault);
  return repeatedKey || holdsNumberText(parsed)
    ? JSON.stringify(parsed, numberTextAsString)
    : utf8.decode(bytes);
}

/**
 * {@link strictJsonTextDecoder} for the JSON messages of one type (`desc`, e.g. a method's input):
 * the parsed message is also checked against its fields as REST checks a body, before protobuf-es
 * reads it — above all the JSON strings of integer fields, which protobuf-es reads with `Number()`
 * / `BigInt()` and so would take as `0x10`, `0b11`, `" 5"` or `"1e2"` (an int64: then refused with
 * no param). A number in a string is a type error (proto/API.md §4), except for an int64 (`seed`:
 * protobuf JSON's own form of it) and `priority`, whose string holds `-?digits` as REST reads it
 * (src/surfaces/rest/decode-completion-request.ts `integerInString`). Throws the first fault (ApiError 400
 * `invalid_request`, param the field), carried to the error envelopes as above. A completion
 * request's prompt list of more than 32,000 prompts is refused while it is parsed
 * (src/surfaces/rpc/prompt-list-caps.ts), before the rest of the body is read. Every method but
 * reflection's reads its JSON with the decoder of its input (src/surfaces/rpc/routes.ts,
 * health-routes.ts): its refusals are then the words the envelopes would find in the body.
 */
export function strictJsonTextDecoderFor(desc: DescMessage): { decode(input?: Uint8Array): string } {
  const caps = jsonArrayCapsOf(desc);
  return {
    decode(input?: Uint8Array): string {
      return decodeStrictly(input ?? new Uint8Array(0), caps, desc);
    },
  };
}

/**
 * Connect's `jsonOptions`: unknown fields refused (not dropped), the bytes read by
 * {@link strictJsonTextDecoderFor}`(input)`, or by {@link strictJsonTextDecoder} without a type.
 * connect-es reads `textDecoder` from jsonOptions (its createJsonSerialization), though the
 * router options' type leaves it out.
 */
export function connectJsonOptions(input?: DescMessage): {
  readonly ignoreUnknownFields: false;
  readonly textDecoder: { decode(input?: Uint8Array): string };
} {
  return {
    ignoreUnknownFields: false,
    textDecoder: input === undefined ? strictJsonTextDecoder : strictJsonTextDecoderFor(input),
  };
}
