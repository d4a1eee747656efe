/**
 * Tokenizers: the Llama 3 encoder gives llama3-tokenizer-js's ids (on inputs the library can
 * handle), encodeAsync gives the same ids as encode, and huge inputs neither overflow the stack
 * nor block the event loop; over HTTP a 2 MB prompt gets its exact count (/tokenize) and vLLM's
 * "prompt too long" 400 (/v1/completions), never a 500.
 */
import llama3Tokenizer from "llama3-tokenizer-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CORPUS } from "../../src/engine/corpus.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { createByteTokenizer, createLlama3Tokenizer } from "../../src/engine/tokenizer.js";
import { postJson } from "./helpers.js";

const llama = createLlama3Tokenizer();
const library = (text: string, bos: boolean): number[] => llama3Tokenizer.encode(text, { bos, eos: false });

/** Deterministic mixed text: letters, digits, contractions, whitespace runs, CJK, emoji, specials. */
function mixedText(length: number, seed: number): string {
  const parts = [
    "a",
    "b",
    "e",
    " ",
    "  ",
    "\n",
    "\r\n",
    "\t",
    "é",
    "ü",
    "ß",
    "Ω",
    "日本",
    "語",
    "😀",
    "\u0301",
    "'s",
    "'LL",
    "'ve",
    "1",
    "23",
    "4567",
    ".",
    "!?",
    "...",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<|foo|>",
    "x",
    "th",
    "ing",
    " the",
    "Alice",
    " was",
    "-",
    "$",
    "\uD800",
  ];
  let s = seed >>> 0;
  let out = "";
  while (out.length < length) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    out += parts[s % parts.length];
  }
  return out;
}

describe("Llama 3 encoder", () => {
  it("gives llama3-tokenizer-js's ids on short mixed strings", () => {
    for (let k = 0; k < 1500; k++) {
      // padded with plain words: the library orders equal-rank merges by position / prompt length,
      // which is only exact while a pre-token's byte length stays below the prompt's length
      const text = mixedText(1 + (k % 50), k) + " and so on".repeat(30);
      expect(llama.encode(text, k % 2 === 0)).toEqual(library(text, k % 2 === 0));
    }
  });

  it("gives the library's ids on a long mixed text, and encodeAsync gives encode's", async () => {
    let text = "";
    for (let k = 0; text.length < 300_000; k++) text += `${CORPUS} ${mixedText(200, k)} `;
    const ids = llama.encode(text, true);
    expect(ids).toEqual(library(text, true));
    expect(await llama.encodeAsync(text, true)).toEqual(ids);
  });

  it("tokenizes a 2 MB single-word prompt without overflowing the stack, yielding to the event loop", async () => {
    const text = "a".repeat(2_000_000);
    // the library's own answer on a smaller run of the same letter: "aaaaaaaa" (id 70540) repeated
    expect(library("a".repeat(8000), false)).toEqual(Array(1000).fill(70540));
    // other callbacks run while it encodes: count the turns a 1 ms interval gets
    let turns = 0;
    const timer = setInterval(() => {
      turns++;
    }, 1);
    const ids = await llama.encodeAsync(text, true);
    clearInterval(timer);
    expect(ids.length).toBe(250_001);
    expect(ids[0]).toBe(128000);
    expect(ids.slice(1).every((id) => id === 70540)).toBe(true);
    // encode alone lets none run; encodeAsync yields between slices of ~8 ms of work (at least
    // 100 ms of work here on any machine: a slower one gives more slices, not fewer)
    expect(turns).toBeGreaterThanOrEqual(5);
  });

  it("the byte tokenizer encodes 2 MB without a spread", () => {
    const ids = createByteTokenizer().encode("é".repeat(1_000_000), true);
    expect(ids.length).toBe(2_000_001);
    expect(ids.slice(0, 3)).toEqual([256, 0xc3, 0xa9]);
  });
});

describe("large prompts over HTTP (llama-8b)", () => {
  let engine: RunningEngine;
  beforeAll(async () => {
    engine = await startEngine({ preset: "llama-8b" });
  });
  afterAll(async () => {
    await engine.close();
  });
  const prompt = "a".repeat(2_000_000);

  it("/tokenize counts a 2 MB prompt exactly", async () => {
    const r = await postJson(`${engine.url}/tokenize`, { model: engine.model.id, prompt });
    expect(r.status).toBe(200);
    expect(r.json.count).toBe(250_001);
    expect(r.json.max_model_len).toBe(1024);
    expect((r.json.tokens as number[]).length).toBe(250_001);
  });

  it("/v1/completions answers vLLM's prompt-too-long 400, stream or not, and stays responsive", async () => {
    for (const stream of [false, true]) {
      const pending = postJson(`${engine.url}/v1/completions`, {
        model: engine.model.id,
        prompt,
        max_tokens: 1,
        stream,
      });
      let settled = false;
      void pending.then(() => {
        settled = true;
      });
      // another request is served while the huge prompt is still being tokenized
      await new Promise((r) => setTimeout(r, 50));
      const health = await fetch(`${engine.url}/health`);
      expect(health.status).toBe(200);
      expect(settled).toBe(false);
      const r = await pending;
      expect(r.status).toBe(400);
      const err = r.json.error as Record<string, unknown>;
      expect(err.param).toBe("input_tokens");
      expect(err.code).toBe(400);
      expect(err.message).toMatch(/^You passed 250001 input tokens and requested 1 output tokens\./);
    }
  });
});
