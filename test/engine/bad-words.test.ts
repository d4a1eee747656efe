/**
 * bad_words as vLLM applies them (src/engine/bad-words.ts): each word's token sequences, as written
 * and after a space, and a sequence's last token never generated right after the rest of it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { badWordsTokenIds } from "../../src/engine/bad-words.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { createByteTokenizer, createLlama3Tokenizer } from "../../src/engine/tokenizer.js";
import { postJson } from "./helpers.js";

interface Choice {
  text: string;
  token_ids: number[];
}

const engines: Record<"tiny" | "llama-8b", RunningEngine | undefined> = {
  tiny: undefined,
  "llama-8b": undefined,
};
beforeAll(async () => {
  engines.tiny = await startEngine({ preset: "tiny" });
  engines["llama-8b"] = await startEngine({ preset: "llama-8b" });
});
afterAll(async () => {
  await engines.tiny?.close();
  await engines["llama-8b"]?.close();
});

/** A greedy completion of "Alice was" (30 tokens, ignore_eos), with `extra` fields. */
async function complete(preset: keyof typeof engines, extra: Record<string, unknown> = {}) {
  const engine = engines[preset]!;
  const body = { model: engine.model.id, prompt: "Alice was", max_tokens: 30, temperature: 0 };
  return postJson(`${engine.url}/v1/completions`, {
    ...body,
    ignore_eos: true,
    return_token_ids: true,
    ...extra,
  });
}

describe("bad_words: token sequences (SamplingParams.update_from_tokenizer)", () => {
  const llama = createLlama3Tokenizer();
  it("a word as written and after a space, when both have as many tokens", () => {
    const [plain, spaced] = [llama.encode("it", false), llama.encode(" it", false)];
    expect(plain).toHaveLength(1);
    expect(spaced).toHaveLength(1);
    expect(badWordsTokenIds(llama, ["it"])).toEqual([plain, spaced]);
    // Leading whitespace is removed first (Python's lstrip), so " it" is the same word.
    expect(badWordsTokenIds(llama, ["  it"])).toEqual([plain, spaced]);
  });
  it("only as written when the space makes more tokens (bytes: the space is a token of its own)", () => {
    expect(badWordsTokenIds(createByteTokenizer(), ["ot"])).toEqual([[111, 116]]);
  });
  it("a word of whitespace only has no tokens: refused, param bad_words", () => {
    expect(() => badWordsTokenIds(llama, [" \u00a0"])).toThrow(/whitespace only/);
  });
});

describe("bad_words: a banned word is never generated where it otherwise is", () => {
  it("llama-8b: ' it' (one token) is generated greedily; banned, it never is", async () => {
    const free = ((await complete("llama-8b")).json.choices as Choice[])[0]!;
    const it = createLlama3Tokenizer().encode(" it", false)[0]!;
    expect(free.token_ids).toContain(it);
    expect(free.text).toMatch(/\bit\b/);
    const banned = await complete("llama-8b", { bad_words: ["it"] });
    expect(banned.status).toBe(200);
    const choice = (banned.json.choices as Choice[])[0]!;
    expect(choice.token_ids).toHaveLength(30);
    expect(choice.token_ids).not.toContain(it);
    expect(choice.text).not.toMatch(/\bit\b/);
  });

  it("tiny: 'ot' (two tokens): 't' is never generated right after 'o', each still is alone", async () => {
    const free = ((await complete("tiny")).json.choices as Choice[])[0]!;
    expect(free.text).toContain("ot");
    const banned = await complete("tiny", { bad_words: ["ot"] });
    const choice = (banned.json.choices as Choice[])[0]!;
    expect(choice.text).not.toContain("ot");
    expect(choice.text).toContain("o"); // the prefix itself is allowed
    // The prompt does not count: a prompt ending in "o" still goes on with "t".
    const prompt = `Alice was${free.text.slice(0, free.text.indexOf("ot") + 1)}`;
    const freeAfter = await complete("tiny", { prompt, max_tokens: 1 });
    expect((freeAfter.json.choices as Choice[])[0]!.text).toBe("t");
    const afterPrompt = await complete("tiny", { prompt, bad_words: ["ot"], max_tokens: 1 });
    expect((afterPrompt.json.choices as Choice[])[0]!.text).toBe("t");
  });

  it("refuses a bad_words that is not a list of strings, or holds a word of whitespace only (400)", async () => {
    for (const bad of ["ot", [1], [" "]]) {
      const r = await complete("tiny", { bad_words: bad });
      expect(r.status, JSON.stringify(bad)).toBe(400);
      expect((r.json.error as { param: string }).param).toBe("bad_words");
    }
  });
});
