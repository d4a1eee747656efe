// Each named step of the service's order of checks (proto/API.md §3, §4), on its own.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import {
  checkContextLength,
  checkDeadlineFeasible,
  checkGeneratedTokensCap,
  checkMaxTokensGiven,
  checkMinTokens,
  checkStreamOnlyFields,
  requestShape,
  resolveMaxTokens,
} from "../../src/service/checks.js";

type Init = Exclude<MessageInitShape<typeof CreateCompletionRequestSchema>, { $typeName: string }>;
const text = { case: "text" as const, value: "x" };
const req = (init: Partial<Init>) =>
  create(CreateCompletionRequestSchema, { model: "m", prompt: text, ...init });

/** The ApiError `fn` throws (or undefined), as {code, param, message}. */
function refusal(fn: () => unknown) {
  try {
    fn();
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    return { code: err.code, param: err.param, message: err.message };
  }
  return undefined;
}

describe("requestShape", () => {
  it.each<[string, Partial<Init>, { prompts: number; n: number }]>([
    ["one text", {}, { prompts: 1, n: 1 }],
    ["texts", { prompt: { case: "texts", value: { values: ["a", "b", "c"] } } }, { prompts: 3, n: 1 }],
    ["token ids", { prompt: { case: "tokenIds", value: { values: [1, 2] } } }, { prompts: 1, n: 1 }],
    [
      "token id lists",
      { prompt: { case: "tokenIdsList", value: { values: [{ values: [1] }, { values: [2] }] } }, n: 4 },
      { prompts: 2, n: 4 },
    ],
  ])("%s", (_name, init, shape) => {
    expect(requestShape(req(init))).toEqual(shape);
  });
});

describe("checkStreamOnlyFields", () => {
  it("refuses stream_options without stream, and prompt_logprobs with it", () => {
    expect(refusal(() => checkStreamOnlyFields(req({ streamOptions: {} }), false))).toMatchObject({
      code: "invalid_request",
      param: "stream_options",
    });
    expect(refusal(() => checkStreamOnlyFields(req({ streamOptions: {} }), true))).toBeUndefined();
    expect(refusal(() => checkStreamOnlyFields(req({ promptLogprobs: 0 }), true))).toMatchObject({
      code: "invalid_request",
      param: "prompt_logprobs",
    });
    expect(refusal(() => checkStreamOnlyFields(req({ promptLogprobs: 0 }), false))).toBeUndefined();
  });
});

describe("checkMaxTokensGiven", () => {
  it.each<[string, Partial<Init>, boolean]>([
    ["one prompt, n 1, left out", {}, true],
    ["n 2, left out", { n: 2 }, false],
    ["n 2, set", { n: 2, maxTokens: 4 }, true],
    ["two prompts, left out", { prompt: { case: "texts", value: { values: ["a", "b"] } } }, false],
    ["two prompts, set", { prompt: { case: "texts", value: { values: ["a", "b"] } }, maxTokens: 1 }, true],
  ])("%s", (_name, init, ok) => {
    const r = req(init);
    const result = refusal(() => checkMaxTokensGiven(r, requestShape(r)));
    if (ok) expect(result).toBeUndefined();
    else expect(result).toMatchObject({ code: "invalid_request", param: "max_tokens" });
  });
});

describe("checkGeneratedTokensCap", () => {
  it("gives the seed's message for n = 2 × 16001", () => {
    const r = req({ n: 2, maxTokens: 16001 });
    expect(refusal(() => checkGeneratedTokensCap(r, requestShape(r)))).toEqual({
      code: "invalid_request",
      param: "max_tokens",
      message:
        "At most 32000 generated tokens in all: n = 2 times max_tokens = 16001 for each of 1 prompts is 32002.",
    });
  });
  it("takes exactly 32,000 in all, and a max_tokens left out", () => {
    const r = req({ n: 4, maxTokens: 8000, prompt: { case: "texts", value: { values: ["a"] } } });
    expect(refusal(() => checkGeneratedTokensCap(r, requestShape(r)))).toBeUndefined();
    const three = req({ maxTokens: 8000, n: 2, prompt: { case: "texts", value: { values: ["a", "b"] } } });
    expect(refusal(() => checkGeneratedTokensCap(three, requestShape(three)))).toBeUndefined();
    const over = req({ maxTokens: 8001, n: 2, prompt: { case: "texts", value: { values: ["a", "b"] } } });
    expect(refusal(() => checkGeneratedTokensCap(over, requestShape(over)))?.message).toContain(
      "for each of 2 prompts is 32004.",
    );
    expect(refusal(() => checkGeneratedTokensCap(req({}), { prompts: 1, n: 1 }))).toBeUndefined();
  });
});

describe("checkDeadlineFeasible", () => {
  it("refuses more than 15,600 without stream, with deadline_infeasible", () => {
    expect(refusal(() => checkDeadlineFeasible(req({ maxTokens: 15_600 }), false))).toBeUndefined();
    expect(refusal(() => checkDeadlineFeasible(req({ maxTokens: 15_601 }), false))).toMatchObject({
      code: "deadline_infeasible",
      param: "max_tokens",
    });
    expect(refusal(() => checkDeadlineFeasible(req({ maxTokens: 15_601 }), true))).toBeUndefined();
    expect(refusal(() => checkDeadlineFeasible(req({}), false))).toBeUndefined();
  });
});

describe("resolveMaxTokens", () => {
  it.each<[string, Partial<Init>, number, number[], boolean, number]>([
    ["as asked", { maxTokens: 7 }, 100, [5], false, 7],
    ["max_model_len − longest prompt", {}, 100, [5, 30], false, 70],
    ["at least 1", {}, 100, [100], false, 1],
    ["at most 15,600 without stream", {}, 131_072, [10], false, 15_600],
    ["at most 32,000 with stream", {}, 131_072, [10], true, 32_000],
    ["max_model_len − prompt when smaller", {}, 20_000, [10], true, 19_990],
  ])("%s", (_name, init, maxModelLen, lengths, stream, expected) => {
    expect(resolveMaxTokens(req(init), maxModelLen, lengths, stream)).toBe(expected);
  });
});

describe("checkContextLength", () => {
  it("takes a prompt that fits exactly, refuses one token more, naming the prompt among several", () => {
    expect(refusal(() => checkContextLength(100, [90], 10))).toBeUndefined();
    expect(refusal(() => checkContextLength(100, [91], 10))).toEqual({
      code: "context_length_exceeded",
      param: "prompt",
      message:
        "This model's maximum context length is 100 tokens. However, you requested 101 tokens (91 in your prompt; 10 for the completion). Please reduce your prompt; or completion length.",
    });
    expect(refusal(() => checkContextLength(100, [10, 95], 10))?.message).toContain(
      "(95 in your prompt (prompt 1);",
    );
  });
});

describe("checkMinTokens", () => {
  it("refuses min_tokens above the resolved max_tokens", () => {
    expect(refusal(() => checkMinTokens(req({ minTokens: 5 }), 5))).toBeUndefined();
    expect(refusal(() => checkMinTokens(req({ minTokens: 6 }), 5))).toMatchObject({
      code: "invalid_request",
      param: "min_tokens",
      message: "Invalid value for 'min_tokens': must be at most max_tokens (5).",
    });
    expect(refusal(() => checkMinTokens(req({}), 1))).toBeUndefined();
  });
});
