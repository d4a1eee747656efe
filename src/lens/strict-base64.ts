// Strict standard base64 (RFC 4648 §4, with padding), as Python's base64.b64encode writes it.
// Node's Buffer.from(s, "base64") skips characters it does not know; a tensor's bytes must not
// silently lose some, so the text is checked first.

const BASE64 = /^[A-Za-z0-9+/]*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/**
 * Bytes that the base64 text `text` holds, or null when it is not strict base64: only
 * `A–Z a–z 0–9 + /`, length a multiple of 4, `=` padding only at the end. No whitespace, no
 * URL-safe alphabet. Costs no allocation for a refusal.
 */
export function strictBase64ByteLength(text: string): number | null {
  if (text.length % 4 !== 0 || !BASE64.test(text)) return null;
  const padding = text.endsWith("==") ? 2 : text.endsWith("=") ? 1 : 0;
  return (text.length / 4) * 3 - padding;
}

/** The bytes of strict base64 text (check it first with {@link strictBase64ByteLength}). */
export function decodeBase64(text: string): Buffer {
  return Buffer.from(text, "base64");
}

/** Standard base64 with padding of `bytes`. */
export function encodeBase64(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
}
