// A scripted tokenizer for fake Inference servers in tests of the prompt bound (a text prompt's
// UTF-8 bytes + the special tokens added, src/service/count-prompt-tokens.ts).

/** The BOS id the scripted tokenizer adds with `add_special_tokens`. */
export const BOS = 1;

/**
 * BOS (with `addSpecial`) + one token per word — fewer than the prompt's bytes — but 16 per word
 * for a prompt that starts with `many`: more than its bytes, as a tokenizer wrongly declared
 * byte-level would give.
 */
export function wordTokenize(prompt: string, addSpecial: boolean): number[] {
  const words = prompt.split(/\s+/).filter((w) => w !== "");
  const perWord = prompt.startsWith("many") ? 16 : 1;
  const ids = words.flatMap((_, i) => Array.from({ length: perWord }, (__, k) => 100 + i * perWord + k));
  return [...(addSpecial ? [BOS] : []), ...ids];
}
