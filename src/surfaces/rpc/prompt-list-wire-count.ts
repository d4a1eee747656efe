// §3 in protobuf binary: how many prompts a CreateCompletionRequest's bytes hold, counted over the
// wire format without decoding them, so that a list no cap allows (src/service/checks.ts
// `maxPromptsPerRequest`) is refused before protobuf-es turns each of its items into a string or
// an array (a 7.5 MB body of 1.2 million short prompts takes ~0.7 s to decode).
import { CreateCompletionRequestSchema, PromptTextsSchema } from "../../../gen/acs/v1/completions_pb.js";
import { compressedFlag, frameEnd, frameHeaderBytes } from "./frame-reader.js";

const fields = CreateCompletionRequestSchema.field;
/** The prompt oneof's list members, by field number (their `values` are repeated, field 1 each). */
const listFields = new Set([fields.texts.number, fields.tokenIdsList.number]);
/** The prompt oneof's other members (one prompt each). */
const singleFields = new Set([fields.text.number, fields.tokenIds.number]);
const valuesField = PromptTextsSchema.field.values.number;

const WIRE_VARINT = 0;
const WIRE_FIXED64 = 1;
const WIRE_LEN = 2;
const WIRE_FIXED32 = 5;

/** Where the scan is: {@link readVarint} reads at it and moves it past what it read. */
let cursor = 0;

/** The varint at {@link cursor} (exact below 2^53), or -1 if cut or over 10 bytes. */
function readVarint(bytes: Uint8Array, to: number): number {
  let value = 0;
  let scale = 1;
  const last = Math.min(to, cursor + 10);
  while (cursor < last) {
    const byte = bytes[cursor++] as number;
    value += (byte & 0x7f) * scale;
    if (byte < 0x80) return value;
    scale *= 128;
  }
  return -1;
}

/**
 * Moves {@link cursor} past the value of a field of `wireType` (a length-delimited field: to its
 * payload, whose length it answers; else answers 0). -1 when the field is cut or its wire type is
 * not one protobuf-es reads without a schema (a group).
 */
function skipToPayload(bytes: Uint8Array, to: number, wireType: number): number {
  switch (wireType) {
    case WIRE_VARINT:
      return readVarint(bytes, to) < 0 ? -1 : 0;
    case WIRE_FIXED64:
      cursor += 8;
      return cursor > to ? -1 : 0;
    case WIRE_FIXED32:
      cursor += 4;
      return cursor > to ? -1 : 0;
    case WIRE_LEN: {
      const length = readVarint(bytes, to);
      return length < 0 || cursor + length > to ? -1 : length;
    }
    default:
      return -1;
  }
}

/**
 * The `values` (field 1, length-delimited) in the message `bytes[from, to)`, counted until there
 * are more than `limit` (the rest is not read); -1 if malformed.
 */
function countValues(bytes: Uint8Array, from: number, to: number, limit: number): number {
  let count = 0;
  cursor = from;
  while (cursor < to && count <= limit) {
    const tag = readVarint(bytes, to);
    if (tag < 8) return -1;
    const wireType = tag % 8;
    const length = skipToPayload(bytes, to, wireType);
    if (length < 0) return -1;
    if (wireType === WIRE_LEN) {
      if (Math.floor(tag / 8) === valuesField) count++;
      cursor += length;
    }
  }
  return count;
}

/**
 * The number of prompts protobuf-es would decode from `bytes`, a CreateCompletionRequest in the
 * binary wire format: the items of the prompt oneof's list member that is set last (occurrences
 * of the same member merge, as protobuf's rules say; another member replaces it), 1 for a single
 * prompt, 0 for none. Undefined when the bytes are not well-formed protobuf: protobuf-es then
 * says why. With a `limit`, a list is read only until it has more items than that (any answer
 * above `limit` then means "more than `limit`"), so a list of millions costs what `limit` items do.
 * Allocates nothing.
 */
export function countWirePrompts(bytes: Uint8Array, limit = Number.POSITIVE_INFINITY): number | undefined {
  let count = 0;
  let member = 0;
  const to = bytes.length;
  cursor = 0;
  while (cursor < to) {
    const tag = readVarint(bytes, to);
    if (tag < 8) return undefined;
    const field = Math.floor(tag / 8);
    const wireType = tag % 8;
    const length = skipToPayload(bytes, to, wireType);
    if (length < 0) return undefined;
    const start = cursor;
    const end = wireType === WIRE_LEN ? start + length : start;
    if (singleFields.has(field)) {
      member = field;
      count = 1;
    } else if (listFields.has(field) && wireType === WIRE_LEN) {
      const values = countValues(bytes, start, end, limit);
      if (values < 0) return undefined;
      count = (member === field ? count : 0) + values;
      member = field;
    }
    cursor = end;
  }
  return count;
}

/** The forms of a binary request body: one bare message (Connect unary) or enveloped frames. */
export type BinaryBodyForm = "message" | "frames";

/**
 * Passes `body` through and throws `refuse()` as soon as the request message it carries (the
 * whole body of a Connect unary call, the first frame of an enveloped one) holds more prompts than
 * `maxPrompts` — before the chunk that completes the message reaches connect-es, which would
 * decode it. `received()` gives every byte of `body` passed on so far (undefined when not kept:
 * the message is then left to protobuf-es and the service's checks, as is a compressed one).
 */
export async function* refuseLongPromptLists(
  body: AsyncIterable<Uint8Array>,
  form: BinaryBodyForm,
  received: () => Uint8Array | undefined,
  maxPrompts: number,
  refuse: () => Error,
): AsyncIterable<Uint8Array> {
  let size = 0;
  let messageEnd: number | undefined;
  let checked = false;
  const check = (message: Uint8Array): void => {
    checked = true;
    const count = countWirePrompts(message, maxPrompts);
    if (count !== undefined && count > maxPrompts) throw refuse();
  };
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (!checked && form === "frames") {
      if (messageEnd === undefined && size >= frameHeaderBytes) {
        const head = received();
        if (head === undefined || ((head[0] as number) & compressedFlag) !== 0) checked = true;
        else messageEnd = frameEnd(head, 0);
      }
      if (!checked && messageEnd !== undefined && size >= messageEnd) {
        const bytes = received();
        if (bytes === undefined) checked = true;
        else check(bytes.subarray(frameHeaderBytes, messageEnd));
      }
    }
    yield chunk;
  }
  if (!checked && form === "message") {
    const bytes = received();
    if (bytes !== undefined) check(bytes);
  }
}
