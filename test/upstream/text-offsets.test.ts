import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { OutputText } from "../../src/engine/output-text.js";
import { createByteTokenizer, createLlama3Tokenizer, type Tokenizer } from "../../src/engine/tokenizer.js";
import { ChoiceTextOffsets, TextOffsets } from "../../src/upstream/index.js";
import {
  decodeLikeTextDecoder,
  expectOffsetsIntoText,
  type OracleToken,
  oraclePlaces,
} from "../helpers/text-offsets-oracle.js";

const R = "\uFFFD";

/** Offsets of a choice given as chunks of [text, tokens] ([text, tokens, true]: its last chunk). */
function offsetsOf(chunks: readonly (readonly [string, readonly string[], true?])[]): number[][] {
  const tracker = new ChoiceTextOffsets();
  return chunks.map(([text, tokens, final]) => tracker.next(text, tokens, final));
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
      name: "three split characters then text: each token starts in the character of its first byte",
      chunks: [["éééx", [R, `${R}${R}`, `${R}${R}`, R, "x"]]],
      offsets: [[0, 0, 1, 2, 3]],
    },
    {
      name: "two split characters side by side, a byte a token: the second's bytes start at 1",
      chunks: [["😀😀", ["<|begin_of_text|>", R, R, R, R, R, R, R, R], true]],
      offsets: [[0, 0, 0, 0, 0, 1, 1, 1, 1]],
    },
    {
      name: "two split characters side by side, Llama 3's tokens (3 bytes and 1 each)",
      chunks: [["😀😀x", [R, R, R, R, "x"]]],
      offsets: [[0, 0, 1, 1, 2]],
    },
    {
      name: "strings that two splits fit: a token gets the earliest character it may start in",
      // 🙂🙃 as Llama 3 cuts them (f0 9f | 99 82 | f0 9f | 99 | 83) fits f0 | 9f 99 | 82 | f0 9f 99 | 83 too.
      chunks: [["🙂🙃x", [R, `${R}${R}`, R, R, R, "x"]]],
      offsets: [[0, 0, 0, 1, 1, 2]],
    },
    {
      name: "split characters at the end of a whole answer",
      chunks: [["a中文", ["a", R, R, R, R, R, R], true]],
      offsets: [[0, 1, 1, 1, 2, 2, 2]],
    },
    {
      name: "split characters at the end of a chunk that is not the last: where they end is not known yet",
      chunks: [["a中文", ["a", R, R, R, R, R, R]]],
      offsets: [[0, 1, 1, 1, 1, 1, 1]],
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

  // The reference engine decodes a token alone as TextDecoder does: a byte order mark that starts
  // the token's bytes is dropped from its string, but kept in the text (not at its start).
  it("a whole answer gives the offsets its stream gives after a U+FEFF token with an empty string (seed 67659485)", () => {
    // The failing choice's text (llama-8b, seed 67659485) as the Llama 3 tokenizer has it: ids
    // 1077 1198 433 3305 11, where 3305 is a BOM's bytes alone (its string empty).
    const tokens = [" her", " --", " it", "", ","];
    const deltas = [" her", " --", " it", "\uFEFF", ","];
    const stream = new ChoiceTextOffsets();
    const streamed = tokens.flatMap((token, i) => stream.next(deltas[i] as string, [token]));
    expect(streamed).toStrictEqual([0, 4, 7, 10, 11]);
    expect(new ChoiceTextOffsets().next(deltas.join(""), tokens)).toStrictEqual(streamed);
  });

  it.each([
    { name: "whole", chunks: [["a\uFEFFusing x", ["a", "using", " x"]]] },
    {
      name: "stream",
      chunks: [
        ["a", ["a"]],
        ["\uFEFFusing", ["using"]],
        [" x", [" x"]],
      ],
    },
  ] as const)(
    "a token whose string lost the U+FEFF that starts its text starts at the U+FEFF ($name)",
    ({ chunks }) => {
      expect(offsetsOf(chunks).flat()).toStrictEqual([0, 1, 7]);
    },
  );

  // A step of speculative decoding generates several tokens, and vLLM sends them in one chunk with
  // the text its detokenizer releases: all of it but the last max(len(stop)) - 1 characters, which
  // may end in the middle of any of the tokens (here stop "\n\nQuestion:": 9 characters held back).
  it.each([
    {
      name: "the tokens after one whose text is held back start at the end of the text",
      chunks: [
        [" P", [" Paris", ".", " The"]],
        ["aris. The c", [" capital", " of"]],
        ["apital of France.", [" France", "."], true],
      ],
      offsets: [
        [0, 2, 2],
        [11, 13],
        [22, 29],
      ],
    },
    {
      name: "a token after one held back is not placed in that one's text (here its space)",
      chunks: [
        [" ", [" Paris", ".", " The"]],
        ["Paris. The c", [" capital", " of"]],
        ["apital of France.", [" France", "."], true],
      ],
      offsets: [
        [0, 1, 1],
        [11, 13],
        [22, 29],
      ],
    },
    {
      name: "a token partly held back after the bytes of a split character starts after the character",
      chunks: [
        ["é wor", [R, R, " world", "!"]],
        ["ld! ", [" Bye"]],
      ],
      offsets: [[0, 0, 1, 5], [8]],
    },
    {
      name: "tokens held back after the bytes of a split character start after the character",
      chunks: [["é", [R, R, " w", "o"]]],
      offsets: [[0, 0, 1, 1]],
    },
    {
      name: "(the whole answer of those tokens)",
      chunks: [
        [" Paris. The capital of France.", [" Paris", ".", " The", " capital", " of", " France", "."], true],
      ],
      offsets: [[0, 6, 7, 11, 19, 22, 29]],
    },
    {
      name: "skipped special tokens followed by text that starts as their string does",
      chunks: [["<|e", ["<|eot_id|>", "<|eot_id|>", "<", "|", "e"]]],
      offsets: [[0, 0, 0, 1, 2]],
    },
    {
      name: "the choice's last chunk holds nothing back: a token cut by a stop string is no token's start",
      chunks: [["<", ["<|eot_id|>", "<S", "%"], true]],
      offsets: [[0, 0, 1]],
    },
    {
      // Before its last chunk, text that ends as the string of a token not yet placed starts is
      // taken as that token's, still arriving (it could be a skipped special token's neighbour).
      name: "before the last chunk, the same text and tokens are taken as held back",
      chunks: [["<", ["<|eot_id|>", "<S", "%"]]],
      offsets: [[0, 1, 1]],
    },
  ] as const)("several tokens a chunk: $name", ({ chunks, offsets }) => {
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
  // U+FEFF: a token of its bytes alone has an empty string, one of them and more (Llama 3 has
  // "\uFEFFusing", "\uFEFF#") a string without it; the text keeps it (not at its start).
  fc.constantFrom("é", "😀", "中文", R, " the", "<|eot_id|>", "ab", "\uFEFF", "\uFEFFusing", "\uFEFF#"),
);
const text = fc.array(piece, { maxLength: 6 }).map((parts) => parts.join(""));

/**
 * How a choice's chunks reach the tracker: as the engine streams them (a chunk per token, the
 * echoed prompt in one), all at once (a whole answer), or regrouped (several tokens a chunk: cut
 * after chunk i when cuts[i % cuts.length]).
 */
type Split = "stream" | "whole" | boolean[];
const streamOrWhole = fc.constantFrom<Split>("stream", "whole");
const anySplit = fc.oneof(streamOrWhole, fc.array(fc.boolean(), { minLength: 1, maxLength: 8 }));

const scenario = fc.record({
  tokenizer: fc.constantFrom("bytes", "llama3"),
  prompt: text.filter((s) => s.length > 0),
  generated: text,
  echo: fc.boolean(),
  addSpecialTokens: fc.boolean(),
  skipSpecialTokens: fc.boolean(),
  includeStop: fc.boolean(),
  stop: fc.array(fc.string({ unit: "grapheme-ascii", minLength: 1, maxLength: 6 }), { maxLength: 2 }),
  /** A stop string taken from the generated text ([start, length] in code points, start modulo its length). */
  stopInText: fc.option(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 6 }))),
  /**
   * Which text a stream holds back for a possible stop string (not included in the output): the
   * reference engine's (the end of the text that starts a stop string), or vLLM's (its v1
   * detokenizer: always the last `max(len(stop)) - 1` characters, whatever they are, until the
   * end).
   */
  holdback: fc.constantFrom("engine", "vllm"),
  /**
   * Tokens generated after the one that completes a stop string, in its chunk (vLLM checks stop
   * strings once per step, and a step of speculative decoding generates several tokens; its chunk
   * has the logprobs of them all).
   */
  afterStop: fc.nat(2),
  specials: fc.array(fc.nat(40), { maxLength: 3 }),
  split: anySplit,
  firstTokenInEchoChunk: fc.boolean(),
});

type Scenario = typeof scenario extends fc.Arbitrary<infer T> ? T : never;

/** One chunk of a choice: its text delta, its token ids, and whether each token's bytes are in the text. */
interface Chunk {
  text: string;
  ids: number[];
  inText: boolean[];
}

/**
 * The chunks of one choice as the engine streams them (its detokenizer, stop strings, held-back
 * text: the engine's, or vLLM's as `s.holdback` says), and the index of the first generated token
 * among all the tokens. Scenarios whose
 * generated text starts with a U+FEFF are skipped (fc.pre): the engine decodes it with
 * TextDecoder, which drops a byte order mark at its start (vLLM keeps it), so an empty token
 * string, or one that lost its U+FEFF, cannot tell whether the text has that U+FEFF.
 */
function engineChunks(s: Scenario, tok: Tokenizer): { chunks: Chunk[]; outputStart: number } {
  const stops = s.stop.filter((x) => x.length > 0);
  const generatedChars = [...s.generated];
  if (s.stopInText !== null && generatedChars.length > 0) {
    const [at, length] = s.stopInText;
    const from = at % generatedChars.length;
    stops.push(generatedChars.slice(from, from + length).join(""));
  }
  const out = new OutputText(tok, s.skipSpecialTokens, stops, s.includeStop);
  const ids = tok.encode(s.generated, false);
  for (const at of s.specials) ids.splice(Math.min(at, ids.length), 0, tok.eosId);
  const decoded = ids.filter((id) => !(s.skipSpecialTokens && tok.isSpecial(id)));
  const first = decoded.slice(0, 3).flatMap((id) => [...tok.tokenBytes(id)]);
  fc.pre(!(first[0] === 0xef && first[1] === 0xbb && first[2] === 0xbf));
  const promptIds = s.echo ? tok.encode(s.prompt, s.addSpecialTokens) : [];
  const heldText = !s.includeStop && stops.length > 0;
  // Held text with what the property did not cover before (vLLM's holdback, chunks of several
  // tokens, a stop string that the text contains): only what the tracker places exactly.
  if (heldText && (s.holdback === "vllm" || Array.isArray(s.split) || s.stopInText !== null)) {
    fc.pre(placedExactly(s, tok, promptIds, ids));
  }
  // vLLM's v1 detokenizer holds back as many characters (code points) as the longest stop string
  // has, but one, until the end.
  const vllmHold = heldText ? Math.max(...stops.map((x) => [...x].length - 1)) : 0;
  let released = 0; // with vLLM's holdback: the text streamed so far (UTF-16 index)
  const generated: { ids: number[]; delta: string }[] = [];
  for (const [i, id] of ids.entries()) {
    const last = i === ids.length - 1;
    const stopped = out.push(id, true) !== null;
    if (stopped || last) out.finish();
    let delta = out.takeDelta();
    if (s.holdback === "vllm") {
      const chars = [...out.text];
      const end = stopped || last ? chars.length : Math.max(0, chars.length - vllmHold);
      const upTo = Math.max(released, chars.slice(0, end).join("").length);
      delta = out.text.slice(released, upTo);
      released = upTo;
    }
    // The tokens after the one that completes a stop string come in its chunk.
    generated.push({ ids: stopped ? ids.slice(i, i + 1 + s.afterStop) : [id], delta });
    if (stopped) break;
  }
  const chunks: Chunk[] = [];
  if (s.echo) {
    chunks.push({
      text: s.prompt,
      ids: promptIds,
      inText: promptIds.map((_, i) => i > 0 || !s.addSpecialTokens),
    });
  }
  for (const g of generated) {
    // Tokens after a stop string are not in the text (the oracle puts them at its end).
    const inText = g.ids.map((id, k) => k === 0 && !(s.skipSpecialTokens && tok.isSpecial(id)));
    chunks.push({ text: g.delta, ids: g.ids, inText });
  }
  if (s.echo && s.firstTokenInEchoChunk && chunks.length > 1) {
    const [echo, first] = chunks.splice(0, 2) as [Chunk, Chunk];
    chunks.unshift(join([echo, first]));
  }
  return { chunks, outputStart: promptIds.length };
}

/**
 * False for text and tokens whose offsets the tracker cannot always give exactly when the text of
 * a chunk of several tokens, or vLLM's, ends in the middle of a token (held back for a possible
 * stop string): it then gives a token it cannot place an offset no later than its place, or takes
 * one reading of strings that allow two. Left out there:
 * - a token of several bytes of a split character shown as one U+FFFD (Llama 3's): the characters
 *   of a run of such tokens are counted short, and a token held back after them starts too early;
 * - a special token next to bytes of a split character: it waits behind them until the text
 *   shows where they end;
 * - a U+FEFF, which an empty token string may or may not stand for;
 * - a token not in the text (BOS, a skipped special token) followed by text that starts as its
 *   string does, or a token followed by one whose string starts its own ("96", later "9"): with
 *   the text ending in that start, either the first token's text is still arriving or it is
 *   absent and the later one is there (the tracker takes the first reading, unless the strings of
 *   the chunk's tokens from the one being placed make up the text from there).
 */
function placedExactly(
  s: Scenario,
  tok: Tokenizer,
  promptIds: readonly number[],
  ids: readonly number[],
): boolean {
  if ((s.prompt + s.generated).includes("\uFEFF")) return false;
  const all = [
    ...promptIds.map((id, i) => ({ id, absent: i === 0 && s.addSpecialTokens })),
    ...ids.map((id) => ({ id, absent: s.skipSpecialTokens && tok.isSpecial(id) })),
  ];
  const strs = all.map(({ id }) => tok.decode([id], false));
  const holds = strs.map((str) => str.includes(R));
  return all.every(({ id, absent }, i) => {
    const str = strs[i] as string;
    if (holds[i] && tok.tokenBytes(id).length > str.split(R).length - 1) return false;
    if (tok.isSpecial(id) && (holds[i - 1] === true || holds[i + 1] === true)) return false;
    if (
      strs.slice(i + 1).some((later) => later !== "" && later.length < str.length && str.startsWith(later))
    ) {
      return false;
    }
    if (!absent) return true;
    const after = all.slice(i + 1).filter((t) => !t.absent);
    const first = [
      ...tok.decode(
        after.map((t) => t.id),
        false,
      ),
    ][0];
    return first === undefined || !str.startsWith(first);
  });
}

function join(chunks: readonly Chunk[]): Chunk {
  return {
    text: chunks.map((c) => c.text).join(""),
    ids: chunks.flatMap((c) => c.ids),
    inText: chunks.flatMap((c) => c.inText),
  };
}

/** The chunks regrouped as `how` says (text and tokens stay together, in order). */
function regroup(chunks: readonly Chunk[], how: Split): Chunk[] {
  if (how === "stream") return [...chunks];
  if (how === "whole") return [join(chunks)];
  const groups: Chunk[] = [];
  let from = 0;
  chunks.forEach((_, i) => {
    if (how[i % how.length] || i === chunks.length - 1) {
      groups.push(join(chunks.slice(from, i + 1)));
      from = i + 1;
    }
  });
  return groups;
}

/** The tracker's offsets for the chunks, with the choice's text and the oracle's view of its tokens. */
function track(tok: Tokenizer, chunks: readonly Chunk[], outputStart: number) {
  const tracker = new ChoiceTextOffsets();
  const offsets: number[] = [];
  const oracle: OracleToken[] = [];
  let received = "";
  for (const [i, c] of chunks.entries()) {
    received += c.text;
    const strs = c.ids.map((id) => tok.decode([id], false));
    offsets.push(...tracker.next(c.text, strs, i === chunks.length - 1));
    c.ids.forEach((id, i) => {
      oracle.push({
        str: strs[i] as string,
        bytes: tok.tokenBytes(id),
        inText: c.inText[i] as boolean,
        receivedCodePoints: [...received].length,
        outputStart: oracle.length === outputStart,
      });
    });
  }
  return { text: received, offsets, oracle };
}

/** Text and tokens of one choice made as the engine makes them; the tracker's offsets checked. */
function checkScenario(s: Scenario): void {
  const tok = tokenizers[s.tokenizer] as Tokenizer;
  const { chunks, outputStart } = engineChunks(s, tok);
  const { text, offsets, oracle } = track(tok, regroup(chunks, s.split), outputStart);
  expectOffsetsIntoText(text, oracle, offsets);
}

/**
 * A whole answer (one `next` call) gives every token the oracle places exactly (its string is in
 * the text where its bytes are) the offset a stream gives it, however the stream is chunked, up to
 * the end of the text the stream has received with the token: text held back for a possible stop
 * string (not included in the output) reaches a stream with a later chunk, and until then the
 * stream's offsets stop at the text received.
 *
 * Not every token: a chunk's end tells the tracker where the text of the tokens so far ends, which
 * a whole answer does not. A token it cannot place (bytes of a split character, a skipped special
 * token) gets the position after the last token placed in a whole answer, but may get a later
 * offset, still no later than its place, in a stream (the end of the chunks before it).
 */
function checkWholeIsStream(s: Scenario): void {
  const tok = tokenizers[s.tokenizer] as Tokenizer;
  const { chunks, outputStart } = engineChunks(s, tok);
  const whole = track(tok, regroup(chunks, "whole"), outputStart);
  const stream = track(tok, regroup(chunks, s.split), outputStart);
  expectOffsetsIntoText(stream.text, stream.oracle, stream.offsets);
  const exact = oraclePlaces(whole.text, whole.oracle).map((p) => p.exact);
  const received = stream.oracle.map((t) => t.receivedCodePoints);
  const atExact = (offsets: number[]) =>
    offsets.map((o, i) => (exact[i] ? Math.min(o, received[i] as number) : null));
  expect(atExact(whole.offsets)).toStrictEqual(atExact(stream.offsets));
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

  // The counterexample of seed -1090726548 (Node 22; the same input fails on Node 20): bytes
  // tokens (one byte each, so every byte of a split character is a U+FFFD of its own) of a literal
  // U+FFFD, a U+FEFF, U+10000 and a U+FEFF, with a skipped special token in the astral character's
  // bytes at the end of a chunk whose text ends in the first U+FEFF. That token was placed after the
  // U+FEFF as if its string had lost it, though the bytes waiting before it did not fit the text so
  // far; the bytes before it were dropped and the next token, "u", got the second U+FEFF's offset.
  const seedCounterexample: Scenario = {
    tokenizer: "bytes",
    prompt: "é",
    generated: `       ${R}\uFEFF\u{10000}\uFEFFusing`,
    echo: false,
    addSpecialTokens: false,
    skipSpecialTokens: true,
    includeStop: false,
    stop: [],
    stopInText: null,
    holdback: "engine",
    afterStop: 0,
    specials: [0, 17],
    split: [false, false, true, false, false],
    firstTokenInEchoChunk: false,
  };

  it("a skipped special token after bytes the text does not hold yet waits for them (seed -1090726548)", () => {
    checkScenario(seedCounterexample);
    checkWholeIsStream(seedCounterexample);
    // The same chunks as the tracker gets them: "u" starts at 11, after the second U+FEFF.
    const eot = "<|end_of_text|>";
    const offsets = offsetsOf([
      ["  ", [eot, " ", " "]],
      ["     ", [" ", " ", " ", " ", " "]],
      [R, [R, R, R, R, R]],
      ["\uFEFF", [R, R, R, R, eot]],
      ["\u{10000}\uFEFFu", [R, R, R, R, "u"]],
      ["sing", ["s", "i", "n", "g"], true],
    ]);
    expect(offsets[4]?.[4]).toBe(11);
    expect(offsets[5]).toStrictEqual([12, 13, 14, 15]);
  });

  it("every offset points into the choice's own text, as the tokens' bytes say", () => {
    fc.assert(fc.property(scenario, checkScenario), { numRuns: 2000 });
  });

  it("a whole answer's offsets are its stream's where the tokens are in the text, however the stream is chunked", () => {
    fc.assert(fc.property(scenario, checkWholeIsStream), { numRuns: 2000 });
  });
});
