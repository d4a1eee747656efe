// An independent oracle for `text_offset`: where each token starts in a choice's text, from the
// tokens' bytes (the engine's tokenizer), not from their strings. Used by the unit property of the
// offset tracker and by the property over generated requests through the gateway.
import { expect } from "vitest";

/** One token of a choice as the oracle sees it. */
export interface OracleToken {
  /** The token string of `logprobs.tokens`. */
  readonly str: string;
  /** The token's bytes (a special token's bytes are its name). */
  readonly bytes: Uint8Array;
  /** False when the token's bytes are not in the text (BOS of an echoed prompt, a skipped special token). */
  readonly inText: boolean;
  /** Code points of the choice's text received up to and including the chunk that carried the token. */
  readonly receivedCodePoints: number;
  /**
   * True for the first generated token: the reference engine decodes the generated text with
   * TextDecoder, which drops a byte order mark at its start, so a U+FEFF whose bytes start where
   * the generated tokens' bytes in the text start is not in the text.
   */
  readonly outputStart?: boolean;
}

/**
 * Decodes UTF-8 as the WHATWG decoder (and so TextDecoder and Python's `errors="replace"`) does —
 * an invalid sequence becomes one U+FFFD — and gives the index of the last byte of each character.
 */
function decodeWithEnds(bytes: Uint8Array): { text: string; ends: number[] } {
  let text = "";
  const ends: number[] = [];
  let needed = 0;
  let seen = 0;
  let cp = 0;
  let lower = 0x80;
  let upper = 0xbf;
  const emit = (c: number, end: number) => {
    text += String.fromCodePoint(c);
    ends.push(end);
  };
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i] as number;
    if (needed === 0) {
      if (b <= 0x7f) emit(b, i);
      else if (b >= 0xc2 && b <= 0xdf) [needed, cp] = [1, b & 0x1f];
      else if (b >= 0xe0 && b <= 0xef) {
        if (b === 0xe0) lower = 0xa0;
        if (b === 0xed) upper = 0x9f;
        [needed, cp] = [2, b & 0xf];
      } else if (b >= 0xf0 && b <= 0xf4) {
        if (b === 0xf0) lower = 0x90;
        if (b === 0xf4) upper = 0x8f;
        [needed, cp] = [3, b & 0x7];
      } else emit(0xfffd, i);
      continue;
    }
    if (b < lower || b > upper) {
      // The sequence so far is invalid: one U+FFFD ending before this byte, which starts afresh.
      [needed, seen, cp, lower, upper] = [0, 0, 0, 0x80, 0xbf];
      emit(0xfffd, i - 1);
      i--;
      continue;
    }
    [lower, upper] = [0x80, 0xbf];
    cp = (cp << 6) | (b & 0x3f);
    seen++;
    if (seen === needed) {
      emit(cp, i);
      [needed, seen, cp] = [0, 0, 0];
    }
  }
  if (needed !== 0) emit(0xfffd, bytes.length - 1);
  return { text, ends };
}

/** Where the oracle puts one token: its place, and whether its string is in the text there. */
export interface OraclePlace {
  /** Code points of the text made entirely of bytes of tokens before it (capped as the offsets are). */
  readonly place: number;
  /** True when its string is in the text at its place: its offset must be exactly `place`. */
  readonly exact: boolean;
}

/**
 * Each token's place in `text`: the number of characters of the text made entirely of bytes of
 * tokens before it (only tokens whose bytes are in the text count), no further than the text
 * received with the token's chunk; `exact` when the token's string (not empty, no U+FFFD) is in
 * the text there.
 */
export function oraclePlaces(text: string, tokens: readonly OracleToken[]): OraclePlace[] {
  const chars = [...text];
  const firstByte: number[] = [];
  let length = 0;
  for (const t of tokens) {
    firstByte.push(length);
    if (t.inText) length += t.bytes.length;
  }
  const all = new Uint8Array(length);
  tokens.forEach((t, i) => {
    if (t.inText) all.set(t.bytes, firstByte[i]);
  });
  const { ends } = decodeWithEnds(all);
  const output = tokens.findIndex((t) => t.outputStart === true);
  if (output >= 0) {
    const from = firstByte[output] as number;
    if (all[from] === 0xef && all[from + 1] === 0xbb && all[from + 2] === 0xbf) {
      // That U+FEFF is not in the text: no character ends there.
      const k = ends.indexOf(from + 2);
      if (k >= 0) ends.splice(k, 1);
    }
  }
  let before = 0; // characters that end before the current token's first byte
  return tokens.map((token, i) => {
    while (before < ends.length && (ends[before] as number) < (firstByte[i] as number)) before++;
    const place = Math.min(before, token.receivedCodePoints, chars.length);
    const exact =
      token.str !== "" &&
      !token.str.includes("\uFFFD") &&
      chars.slice(before, before + [...token.str].length).join("") === token.str;
    return { place, exact };
  });
}

/**
 * Asserts that `offsets` point into `text` (both per choice). A token's place is as
 * {@link oraclePlaces} gives it; then:
 * - one offset per token, never decreasing, never past the text received with the token's chunk;
 * - a token whose string is in the text at its place has exactly that offset (or the end of the
 *   text received so far, when its text has not arrived yet);
 * - every other token (bytes of a split character, skipped special tokens, tokens cut by a stop
 *   string) has an offset no later than its place.
 * Offsets are code points (Python `str` indices).
 */
export function expectOffsetsIntoText(
  text: string,
  tokens: readonly OracleToken[],
  offsets: readonly number[],
) {
  expect(offsets).toHaveLength(tokens.length);
  const chars = [...text];
  const places = oraclePlaces(text, tokens);
  let previous = 0;
  tokens.forEach((token, i) => {
    const offset = offsets[i] as number;
    const { place, exact } = places[i] as OraclePlace;
    const where = `token ${i} ${JSON.stringify(token.str)} of ${JSON.stringify(text)} (offsets ${JSON.stringify(offsets)})`;
    expect(offset, where).toBeGreaterThanOrEqual(previous);
    expect(offset, where).toBeLessThanOrEqual(Math.min(token.receivedCodePoints, chars.length));
    if (exact) expect(offset, where).toBe(place);
    else expect(offset, where).toBeLessThanOrEqual(place);
    previous = offset;
  });
}

/** The oracle's own decoder equals TextDecoder (a check of the oracle, for its tests). */
export function decodeLikeTextDecoder(bytes: Uint8Array): string {
  return decodeWithEnds(bytes).text;
}
