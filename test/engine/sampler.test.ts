/** Sampler filters: top_p nucleus, top_k, min_p, greedy, min_tokens — checked by the set of tokens ever drawn. */
import { describe, expect, it } from "vitest";
import { createRng } from "../../src/engine/prng.js";
import { type SamplingParams, sampleToken } from "../../src/engine/sampler.js";

const params = (over: Partial<SamplingParams>): SamplingParams => ({
  n: 1,
  temperature: 1,
  topP: 1,
  topK: 0,
  minP: 0,
  repetitionPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  seed: null,
  maxTokens: 16,
  minTokens: 0,
  ignoreEos: false,
  stop: [],
  stopTokenIds: [],
  includeStopStrInOutput: false,
  logprobs: null,
  promptLogprobs: null,
  skipSpecialTokens: true,
  logitBias: null,
  allowedTokenIds: null,
  badWords: [],
  ...over,
});

// probabilities 0.5, 0.3, 0.15, 0.05 (token 4 = EOS with probability 0 after the tail)
const logits = Float32Array.from([0.5, 0.3, 0.15, 0.05, 1e-9].map(Math.log));

function drawn(
  p: SamplingParams,
  generated = 0,
  bad: { outputIds: number[]; badWordsTokenIds: number[][] } = { outputIds: [], badWordsTokenIds: [] },
): number[] {
  const rng = createRng("sampler-test");
  const seen = new Set<number>();
  for (let i = 0; i < 2000; i++) {
    const state = { rng, promptCounts: new Map(), outputCounts: new Map(), generated, eosId: 0 };
    seen.add(sampleToken(logits, p, { ...state, ...bad }));
  }
  return [...seen].sort();
}

describe("sampler", () => {
  it("top_p keeps the smallest nucleus reaching p", () => {
    expect(drawn(params({ topP: 0.8 }))).toEqual([0, 1]);
    expect(drawn(params({ topP: 0.81 }))).toEqual([0, 1, 2]);
    expect(drawn(params({ topP: 0.4 }))).toEqual([0]);
  });
  it("top_k and min_p", () => {
    expect(drawn(params({ topK: 3 }))).toEqual([0, 1, 2]);
    expect(drawn(params({ minP: 0.25 }))).toEqual([0, 1, 2]);
    expect(drawn(params({ minP: 0.5 }))).toEqual([0, 1]);
  });
  it("greedy takes the argmax; min_tokens masks EOS", () => {
    expect(drawn(params({ temperature: 0 }))).toEqual([0]);
    expect(drawn(params({ temperature: 0, minTokens: 2 }), 1)).toEqual([1]);
  });
  it("bad_words: a sequence's last token is masked only after the rest of it was generated", () => {
    const greedy = params({ temperature: 0 });
    const ban = (outputIds: number[], badWordsTokenIds: number[][]) =>
      drawn(greedy, outputIds.length, { outputIds, badWordsTokenIds });
    expect(ban([], [[0]])).toEqual([1]); // one token: always banned
    expect(ban([3, 2], [[2, 0]])).toEqual([1]); // the prefix [2] just generated
    expect(ban([2, 3], [[2, 0]])).toEqual([0]); // [2] generated, but not just before
    expect(ban([], [[2, 0]])).toEqual([0]); // longer than what was generated + 1
    expect(ban([2], [[2, 0], [1]])).toEqual([2]); // several sequences at once
    expect(drawn(params({}), 0, { outputIds: [], badWordsTokenIds: [[0], [1]] })).toEqual([2, 3]);
  });
});
