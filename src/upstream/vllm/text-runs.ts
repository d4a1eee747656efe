// The string and byte arithmetic of src/upstream/vllm/text-offsets.ts: token strings that hold
// bytes of split characters (U+FFFD), their runs split over the characters they make up
// ({@link splitRun}), UTF-8 lengths and code point counts.

/** How far ahead (UTF-16 code units) a token is looked for after tokens that were not found. */
export const maxLookahead = 4096;

const replacementChar = "\uFFFD";

/** True for a token string that stands for bytes of a character split over tokens (or invalid bytes). */
export const holdsBytes = (token: string): boolean => token.includes(replacementChar);

/**
 * Gives the tokens of a run of tokens holding bytes (U+FFFD in their strings) that the tracker put
 * all at the run's start the characters their first bytes belong to, where the strings allow one
 * reading: a run of one call whose text is known from its start (after a token that holds no
 * bytes, or the choice's first token) to its end (the next token's offset, or the end of the
 * text with `final`). `offsets` (code points; `callText` starts at code point `callStart`) is
 * changed in place, only to later offsets within the run, so it stays never decreasing.
 */
export function splitRuns(
  tokens: readonly string[],
  offsets: number[],
  callText: string,
  callStart: number,
  firstCall: boolean,
  final: boolean,
): void {
  let chars: string[] | undefined;
  for (let i = 0; i < tokens.length; i++) {
    if (!holdsBytes(tokens[i] as string)) continue;
    let j = i;
    while (j < tokens.length && holdsBytes(tokens[j] as string)) j++;
    const from = i;
    i = j;
    // Known from its start: after a token of this call that holds no bytes, or the first token.
    if (from === 0 && !firstCall) continue;
    const start = offsets[from] as number;
    if (offsets.slice(from, j).some((o) => o !== start)) continue;
    chars ??= [...callText];
    const end = j < tokens.length ? (offsets[j] as number) : final ? callStart + chars.length : -1;
    if (end <= start || start < callStart) continue;
    const run = chars.slice(start - callStart, end - callStart);
    const split = splitRun(tokens.slice(from, j), run);
    if (split === undefined) continue;
    for (const [k, o] of split.entries()) offsets[from + k] = start + o;
  }
}

/**
 * The character (index into `chars`) each of `tokens` starts in, when the tokens' bytes are
 * exactly the bytes of `chars` and each token's string is its bytes decoded alone (WHATWG /
 * Python "replace": each lone continuation byte one U+FFFD, a character cut at the token's end
 * one U+FFFD). Where the strings allow several readings, a token gets the earliest character it
 * may start in; undefined when none fits (or `chars` holds a U+FFFD: the text's own, ambiguous).
 */
export function splitRun(tokens: readonly string[], chars: readonly string[]): number[] | undefined {
  if (chars.includes(replacementChar) || tokens.length > maxLookahead || chars.length > maxLookahead) {
    return undefined;
  }
  const lengths = chars.map((ch) => utf8Length(ch, 3));
  /** A state between tokens: `c` characters done and `b` bytes of the next (key c * 4 + b). */
  const key = (c: number, b: number) => c * 4 + b;
  const step = (token: string, c0: number, b0: number): number[] => {
    let c = c0;
    let b = b0;
    const units = [...token];
    let k = 0;
    // Bytes that continue a character begun in an earlier token: one U+FFFD each.
    for (; k < units.length && b > 0; k++) {
      if (units[k] !== replacementChar) return [];
      b++;
      if (b === lengths[c]) {
        c++;
        b = 0;
      }
    }
    // Whole characters, as themselves.
    for (; k < units.length && units[k] !== replacementChar; k++) {
      if (chars[c] !== units[k]) return [];
      c++;
    }
    if (k === units.length) return [key(c, b)];
    // The start of a character cut at the token's end: its last unit, 1 to length − 1 bytes.
    const length = lengths[c] ?? 0;
    if (k !== units.length - 1 || length < 2) return [];
    return Array.from({ length: length - 1 }, (_, n) => key(c, n + 1));
  };
  // Forward: the states each token may start in.
  const forward: Set<number>[] = [new Set([key(0, 0)])];
  for (const [t, token] of tokens.entries()) {
    const next = new Set<number>();
    for (const s of forward[t] as Set<number>) for (const e of step(token, s >> 2, s & 3)) next.add(e);
    forward.push(next);
  }
  const last = key(chars.length, 0);
  if (!(forward[tokens.length] as Set<number>).has(last)) return undefined;
  // Backward: keep the states that lead to the end; a token starts in the earliest character left.
  const out = new Array<number>(tokens.length);
  let live = new Set([last]);
  for (let t = tokens.length - 1; t >= 0; t--) {
    const before = new Set<number>();
    for (const s of forward[t] as Set<number>)
      if (step(tokens[t] as string, s >> 2, s & 3).some((e) => live.has(e))) before.add(s);
    out[t] = Math.min(...[...before].map((s) => s >> 2));
    live = before;
  }
  return out;
}

/** True when `text` is the strings of some of `tokens` from the `from`th on, in order (the others not in it). */
export function spells(tokens: readonly string[], from: number, text: string): boolean {
  let at = 0;
  for (let i = from; i < tokens.length && at < text.length; i++) {
    const token = tokens[i] as string;
    if (token !== "" && text.startsWith(token, at)) at += token.length;
  }
  return at === text.length;
}

/** UTF-8 bytes of `s`, counting each U+FFFD as `replacementBytes` (it stands for 1 to 3 bytes). */
export function utf8Length(s: string, replacementBytes: number): number {
  let n = 0;
  for (const ch of s) {
    const c = ch.codePointAt(0) as number;
    n += c === 0xfffd ? replacementBytes : c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  return n;
}

/** Code points of `s` in [from, to) (UTF-16 indices on code point boundaries). */
export function codePoints(s: string, from: number, to: number): number {
  let n = 0;
  for (let i = from; i < to; i++) {
    const c = s.charCodeAt(i);
    // The low half of a surrogate pair is not a code point of its own.
    if (c >= 0xdc00 && c <= 0xdfff && i > from) {
      const h = s.charCodeAt(i - 1);
      if (h >= 0xd800 && h <= 0xdbff) continue;
    }
    n++;
  }
  return n;
}
