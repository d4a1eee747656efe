// JSON text written in pieces: literal JSON and the base64 of bytes, so that a request body holding
// a large tensor (a steering vector of up to 32 MiB, ~45 MB as base64) is never one string, nor
// one string per level of JSON encoding. Base64 needs no escaping inside a JSON string, so the
// tensor's base64 can sit in a JSON string that itself holds JSON (vLLM's `vllm_xargs` values).

/** Bytes to be written as standard base64 (RFC 4648, padded) where they stand in a JSON text. */
export interface Base64Source {
  /** Bytes in all: the base64 text has 4 × ⌈byteLength / 3⌉ characters. */
  readonly byteLength: number;
  /**
   * The bytes, in order, in pieces of any size; a fresh iteration every call (a body may be sent
   * more than once). Each piece is read before the next is asked for, so a piece's memory may be
   * reused for the next.
   */
  chunks(): Iterable<Uint8Array>;
}

/** A piece of a {@link JsonText}: literal JSON text, or the base64 of some bytes. */
export type JsonTextPart = string | Base64Source;

/** A JSON text as pieces; its text is the concatenation of the pieces (base64 for the sources). */
export interface JsonText {
  readonly kind: "json-text";
  readonly parts: readonly JsonTextPart[];
}

/** Bytes read from a source per base64 piece: 48 KiB (a multiple of 3) → 64 KiB of base64. */
const BASE64_CHUNK_BYTES = 3 * 16 * 1024;

/** A JsonText of `parts`, adjacent literals joined. */
export function jsonText(parts: readonly JsonTextPart[]): JsonText {
  const joined: JsonTextPart[] = [];
  for (const part of parts) {
    const last = joined[joined.length - 1];
    if (typeof part === "string" && typeof last === "string") joined[joined.length - 1] = last + part;
    else if (part !== "") joined.push(part);
  }
  return { kind: "json-text", parts: joined };
}

/** True for a {@link JsonText} (and not a plain string). */
export function isJsonText(value: unknown): value is JsonText {
  return typeof value === "object" && value !== null && (value as { kind?: unknown }).kind === "json-text";
}

/** Characters of the base64 of `byteLength` bytes (with padding). */
export function base64Length(byteLength: number): number {
  return 4 * Math.ceil(byteLength / 3);
}

/**
 * The base64 text of `source` in pieces of at most 64 KiB, never the whole text at once. Throws
 * Error when the source yields a different number of bytes than its `byteLength`.
 */
export function* base64Chunks(source: Base64Source): Generator<string> {
  const carry = Buffer.alloc(3);
  let carried = 0;
  let total = 0;
  for (const chunk of source.chunks()) {
    total += chunk.byteLength;
    let bytes = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    if (carried > 0) {
      const take = Math.min(3 - carried, bytes.length);
      bytes.copy(carry, carried, 0, take);
      carried += take;
      bytes = bytes.subarray(take);
      if (carried < 3) continue;
      yield carry.toString("base64");
      carried = 0;
    }
    const whole = bytes.length - (bytes.length % 3);
    for (let at = 0; at < whole; at += BASE64_CHUNK_BYTES) {
      yield bytes.subarray(at, Math.min(at + BASE64_CHUNK_BYTES, whole)).toString("base64");
    }
    carried = bytes.copy(carry, 0, whole);
  }
  if (carried > 0) yield carry.subarray(0, carried).toString("base64");
  if (total !== source.byteLength) {
    throw new Error(`a base64 source declared ${source.byteLength} bytes but gave ${total}`);
  }
}

/** The text of `text` in pieces (literals as they are, base64 in pieces of at most 64 KiB). */
export function* jsonTextChunks(text: JsonText): Generator<string> {
  for (const part of text.parts) {
    if (typeof part === "string") yield part;
    else yield* base64Chunks(part);
  }
}

/** UTF-8 bytes of the text of `text`, computed without writing it (base64 is ASCII). */
export function jsonTextByteLength(text: JsonText): number {
  let n = 0;
  for (const part of text.parts) {
    n += typeof part === "string" ? Buffer.byteLength(part) : base64Length(part.byteLength);
  }
  return n;
}

/** The whole text of `text` as one string (for small texts and tests: it costs a full copy). */
export function jsonTextToString(text: JsonText): string {
  return [...jsonTextChunks(text)].join("");
}

/**
 * The JSON string literal whose value is the text of `text` — `"…"`, literals escaped as
 * JSON.stringify escapes them, base64 kept as pieces (its alphabet needs no escaping) — as a
 * JsonText: JSON that holds JSON in a string, doubly encoded, without writing the base64.
 */
export function jsonStringOf(text: JsonText): JsonText {
  return jsonText([
    '"',
    ...text.parts.map((part) => (typeof part === "string" ? JSON.stringify(part).slice(1, -1) : part)),
    '"',
  ]);
}
