import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { OutputText } from "../../src/engine/output-text.js";
import { createByteTokenizer, createLlama3Tokenizer, type Tokenizer } from "../../src/engine/tokenizer.js";
import { ChoiceTextOffsets, TextOffsets } from "../../src/upstream/index.js";
import {
  decodeLikeTextDecoder,
  expectOffsetsIntoText,
  type OracleToken,
} from "../helpers/text-offsets-oracle.js";

const R = "\uFFFD";

/** Offsets of a choice given as chunks of [text, tokens]. */
function offsetsOf(chunks: readonly (readonly [string, readonly string[]])[]): number[][] {
  const tracker = new ChoiceTextOffsets();
  return chunks.map(([text, tokens]) => tracker.next(text, tokens));
}

describe("ChoiceTextOffsets", () => {
  it.each([
    {
      name: "an echoed prompt's BOS is not in the text: zero width at 0, not 17 characters",
      chunks: [["The sky is blue!", ["<|begin_of_text|>", "The", " sky", " is", " blue", "!"]]],
      offsets: [[0, 0, 3, 7, 10, 15]],
    },
    {
      name: "a skipped special token in the middle has zero width",
      chunks: [["ab", ["a", "<|eot_id|>", "b"]]],
      offsets: [[0, 1, 1]],
    },
    {
      name: "a special token kept in the text (skip_special_tokens false) has its width",
      chunks: [["a<|eot_id|>b", ["a", "<|eot_id|>", "b"]]],
      offsets: [[0, 1, 11]],
    },
    {
      name: "the bytes of a split character (U+FFFD each) start where the character starts",
      chunks: [["éx", [R, R, "x"]]],
      offsets: [[0, 0, 1]],
    },
    {
      name: "a character outside the BMP counts one code point",
      chunks: [["😀 ok", [R, `${R}${R}`, " ok"]]],
      offsets: [[0, 0, 1]],
    },
    {
      name: "a split character followed by the same character as one token",
      chunks: [["ééx", [R, R, "é", "x"]]],
      offsets: [[0, 0, 1, 2]],
    },
    {
      name: "three split characters then text (the run's bytes decide where the text resumes)",
      chunks: [["éééx", [R, `${R}${R}`, `${R}${R}`, R, "x"]]],
      offsets: [[0, 0, 0, 0, 3]],
    },
    {
      name: "empty token strings (partial bytes in older vLLM) have zero width",
      chunks: [["éx", ["", "é", "x"]]],
      offsets: [[0, 0, 1]],
    },
    {
      name: "a U+FFFD that is in the text (invalid bytes) is found there",
      chunks: [[`a${R}b`, ["a", R, "b"]]],
      offsets: [[0, 1, 2]],
    },
    {
      name: "tokens after a stop string cut the text stay at its end",
      chunks: [["hello", ["hel", "lo wor", "ld"]]],
      offsets: [[0, 3, 5]],
    },
    {
      name: "stream: text held back for a stop string arrives with a later chunk",
      chunks: [
        ["", ["c"]],
        ["c", ["c"]],
        ["cx", ["x"]],
      ],
      offsets: [[0], [1], [2]],
    },
    {
      name: "stream: a split character arrives with the token that completes it",
      chunks: [
        ["", [R]],
        ["é", [R]],
        ["é", ["é"]],
        ["!", ["!"]],
      ],
      offsets: [[0], [0], [1], [2]],
    },
    {
      name: "stream: vLLM's echo chunk carries the prompt and the first generated token",
      chunks: [
        ["Hi there", ["<|begin_of_text|>", "Hi", " there"]],
        [" you", [" you"]],
      ],
      offsets: [[0, 0, 2], [8]],
    },
    {
      name: "text without logprobs is still counted",
      chunks: [
        ["ab", []],
        ["c", ["c"]],
      ],
      offsets: [[], [2]],
    },
  ] as const)("$name", ({ chunks, offsets }) => {
    expect(offsetsOf(chunks)).toStrictEqual(offsets);
  });

  it("keeps one tracker per choice index (choices interleave in a stream)", () => {
    const offsets = new TextOffsets();
    expect(offsets.of(0).next("ab", ["ab"])).toStrictEqual([0]);
    expect(offsets.of(1).next("x", ["x"])).toStrictEqual([0]);
    expect(offsets.of(0).next("c", ["c"])).toStrictEqual([2]);
    expect(offsets.of(1).next("y", ["y"])).toStrictEqual([1]);
  });
});

// The property: text and tokens made the way the reference engine makes them (its tokenizers and
// its incremental detokenizer with stop strings and held-back text), checked against the oracle.
const tokenizers: Record<string, Tokenizer> = {
  bytes: createByteTokenizer(),
  llama3: createLlama3Tokenizer(),
};
const piece = fc.oneof(
  fc.string({ unit: "grapheme-ascii", maxLength: 8 }),
  fc.string({ unit: "binary", maxLength: 4 }),
  fc.constantFrom("é", "😀", "中文", R, " the", "<|eot_id|>", "ab"),
);
const text = fc.array(piece, { maxLength: 6 }).map((parts) => parts.join(""));

const scenario = fc.record({
  tokenizer: fc.constantFrom("bytes", "llama3"),
  prompt: text.filter((s) => s.length > 0),
  generated: text,
  echo: fc.boolean(),
  addSpecialTokens: fc.boolean(),
  skipSpecialTokens: fc.boolean(),
  includeStop: fc.boolean(),
  stop: fc.array(fc.string({ unit: "grapheme-ascii", minLength: 1, maxLength: 3 }), { maxLength: 2 }),
  specials: fc.array(fc.nat(40), { maxLength: 3 }),
  stream: fc.boolean(),
  firstTokenInEchoChunk: fc.boolean(),
});

type Scenario = typeof scenario extends fc.Arbitrary<infer T> ? T : never;

/** Text and tokens of one choice made as the engine makes them; the tracker's offsets checked. */
function checkScenario(s: Scenario): void {
  const tok = tokenizers[s.tokenizer] as Tokenizer;
  const stops = s.stop.filter((x) => x.length > 0);
  const out = new OutputText(tok, s.skipSpecialTokens, stops, s.includeStop);
  const ids = tok.encode(s.generated, false);
  for (const at of s.specials) ids.splice(Math.min(at, ids.length), 0, tok.eosId);
  const generated: { id: number; delta: string }[] = [];
  for (const [i, id] of ids.entries()) {
    const last = i === ids.length - 1;
    const stopped = out.push(id, true) !== null;
    if (stopped || last) out.finish();
    generated.push({ id, delta: out.takeDelta() });
    if (stopped) break;
  }
  const promptIds = s.echo ? tok.encode(s.prompt, s.addSpecialTokens) : [];
  const chunks: { text: string; ids: number[]; inText: boolean[] }[] = [];
  if (s.echo) {
    chunks.push({
      text: s.prompt,
      ids: promptIds,
      inText: promptIds.map((_, i) => i > 0 || !s.addSpecialTokens),
    });
  }
  for (const g of generated) {
    chunks.push({ text: g.delta, ids: [g.id], inText: [!(s.skipSpecialTokens && tok.isSpecial(g.id))] });
  }
  if (s.echo && s.firstTokenInEchoChunk && chunks.length > 1) {
    const [echo, first] = chunks.splice(0, 2) as [(typeof chunks)[0], (typeof chunks)[0]];
    chunks.unshift({
      text: echo.text + first.text,
      ids: [...echo.ids, ...first.ids],
      inText: [...echo.inText, ...first.inText],
    });
  }
  const whole = s.stream
    ? chunks
    : [
        {
          text: chunks.map((c) => c.text).join(""),
          ids: chunks.flatMap((c) => c.ids),
          inText: chunks.flatMap((c) => c.inText),
        },
      ];

  const tracker = new ChoiceTextOffsets();
  const offsets: number[] = [];
  const oracle: OracleToken[] = [];
  let received = "";
  for (const c of whole) {
    received += c.text;
    const strs = c.ids.map((id) => tok.decode([id], false));
    offsets.push(...tracker.next(c.text, strs));
    c.ids.forEach((id, i) => {
      oracle.push({
        str: strs[i] as string,
        bytes: tok.tokenBytes(id),
        inText: c.inText[i] as boolean,
        receivedCodePoints: [...received].length,
      });
    });
  }
  expectOffsetsIntoText(received, oracle, offsets);
}

describe("ChoiceTextOffsets (property)", () => {
  it("(the oracle decodes bytes as TextDecoder does)", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 24 }), (bytes) => {
        expect(decodeLikeTextDecoder(bytes)).toBe(new TextDecoder().decode(bytes));
      }),
      { numRuns: 5000 },
    );
  });

  it("every offset points into the choice's own text, as the tokens' bytes say", () => {
    fc.assert(fc.property(scenario, checkScenario), { numRuns: 1000 });
  });
});
