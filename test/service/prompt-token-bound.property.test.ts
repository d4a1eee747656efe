// The bound the gateway uses instead of /tokenize (src/service/count-prompt-tokens.ts) is sound
// for the reference engine's tokenizers: a text prompt never has more tokens than its UTF-8 bytes
// plus the special tokens added (BOS), over random Unicode text, special tokens written in it, and
// long runs that BPE merges least.
import { create } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { createByteTokenizer, createLlama3Tokenizer } from "../../src/engine/tokenizer.js";
import { boundPromptTokens } from "../../src/service/count-prompt-tokens.js";

const llama = createLlama3Tokenizer();
const bytes = createByteTokenizer();

/** Random Unicode (every plane, lone surrogates included), special tokens and repeats. */
const text = fc.oneof(
  fc.string({ unit: "binary", maxLength: 200 }),
  fc.string({ unit: "grapheme", maxLength: 200 }),
  fc
    .array(
      fc.oneof(
        fc.string({ unit: "binary", maxLength: 8 }),
        fc.constantFrom("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", " ", "\n", "é", "🙂", "'s"),
      ),
      { maxLength: 40 },
    )
    .map((parts) => parts.join("")),
  fc
    .tuple(fc.string({ unit: "binary", minLength: 1, maxLength: 3 }), fc.integer({ min: 1, max: 300 }))
    .map(([piece, times]) => piece.repeat(times)),
);

const request = (prompt: string) =>
  create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "text", value: prompt } });

describe("boundPromptTokens", () => {
  for (const [name, tok] of [
    ["Llama 3", llama],
    ["byte", bytes],
  ] as const) {
    it(`is at least the ${name} tokenizer's count, with and without special tokens`, () => {
      const specials = tok.encode("", true).length;
      expect(specials).toBe(1); // BOS, as vLLM adds it for a text prompt
      fc.assert(
        fc.property(text, fc.boolean(), (prompt, addSpecial) => {
          const [bound] = boundPromptTokens(request(prompt), addSpecial ? specials : 0);
          expect(tok.encode(prompt, addSpecial).length).toBeLessThanOrEqual(bound!);
        }),
        { numRuns: 2000 },
      );
    });
  }

  it("counts token-id prompts by their length and each text of a list by itself", () => {
    const ids = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "tokenIdsList", value: { values: [{ values: [1, 2, 3] }, { values: [4] }] } },
    });
    expect(boundPromptTokens(ids, 1)).toEqual([3, 1]);
    const texts = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "texts", value: { values: ["ab", "é🙂", ""] } },
    });
    expect(boundPromptTokens(texts, 1)).toEqual([3, 7, 1]);
  });
});
