/**
 * vLLM's `bad_words`, as SamplingParams.update_from_tokenizer turns them into token sequences and
 * vLLM v1's sampler (sample/ops/bad_words.py) applies them: each word is encoded without special
 * tokens as written (leading whitespace removed) and after one space (kept only when that gives as
 * many tokens and another first token); at each step, the last token of a sequence is forbidden
 * when the tokens generated just before it are the sequence's other tokens. Only generated tokens
 * count, never the prompt's.
 */
import { EngineError } from "./steering.js";
import type { Tokenizer } from "./tokenizer.js";

/** Whether Python's `str.isspace()` takes `c`: \t–\r, U+001C–U+001F, U+0085 and Unicode's separators (Z). */
function isPythonSpace(c: string): boolean {
  const code = c.codePointAt(0)!;
  return (
    (code >= 0x09 && code <= 0x0d) || (code >= 0x1c && code <= 0x1f) || code === 0x85 || /\p{Z}/u.test(c)
  );
}

/** Python's `str.lstrip()`: `text` without its leading whitespace. */
function lstrip(text: string): string {
  let start = 0;
  while (start < text.length && isPythonSpace(text[start]!)) start++;
  return text.slice(start);
}

/**
 * The token sequences of `words` (one or two per word, in vLLM's order).
 * @throws EngineError 400 (param `bad_words`) for a word of whitespace only: it has no tokens
 *   (vLLM fails there with an IndexError, a 500)
 */
export function badWordsTokenIds(tok: Tokenizer, words: readonly string[]): number[][] {
  const sequences: number[][] = [];
  for (const word of words) {
    const bare = lstrip(word);
    const plain = tok.encode(bare, false);
    if (plain.length === 0) {
      throw new EngineError(
        `bad_words cannot contain a word of whitespace only, got ${JSON.stringify(word)}.`,
        400,
        "BadRequestError",
        "bad_words",
      );
    }
    sequences.push(plain);
    const spaced = tok.encode(` ${bare}`, false);
    if (spaced[0] !== plain[0] && spaced.length === plain.length) sequences.push(spaced);
  }
  return sequences;
}

/** Sets to −inf, in `logits`, the last token of every sequence whose other tokens end `generated`. */
export function applyBadWords(
  logits: Float32Array,
  sequences: readonly (readonly number[])[],
  generated: readonly number[],
): void {
  for (const sequence of sequences) {
    const prefix = sequence.length - 1;
    if (prefix > generated.length) continue;
    const from = generated.length - prefix;
    let matches = true;
    for (let i = 0; i < prefix && matches; i++) matches = generated[from + i] === sequence[i];
    const last = sequence[prefix]!;
    if (matches && last < logits.length) logits[last] = Number.NEGATIVE_INFINITY;
  }
}
