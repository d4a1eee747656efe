import { create, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import {
  CompletionChoiceSchema,
  CreateCompletionResponseSchema,
  FinishReason,
  StreamCompletionResponseSchema,
  UsageSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import {
  parseVllmCompletion,
  parseVllmCompletionChunk,
  parseVllmJson,
  TextOffsets,
  toCompletionResponse,
  toStreamChunk,
} from "../../src/upstream/index.js";

// A vLLM response as text, the way Inference writes it: integer-like keys come after others in
// top_logprobs ("1" is a token), and prompt_logprobs lists the prompt token before the top ranks.
const vllmText = `{
  "id": "cmpl-req_upstream_id", "object": "text_completion", "created": 1700000123, "model": "served/model",
  "choices": [
    {"index": 0, "text": "Hello 1", "finish_reason": "stop", "stop_reason": "\\n",
     "logprobs": {"text_offset": [0, 5, 6], "token_logprobs": [null, -0.5, -9999.0], "tokens": ["Hello", " ", "1"],
                  "top_logprobs": [null, {" ": -0.5, "1": -1.25}, {"1": -9999.0, "one": -3}]},
     "prompt_logprobs": [null, {"9906": {"logprob": -7.5, "rank": 12, "decoded_token": "Hello"},
                                "40": {"logprob": -1.0, "rank": 1, "decoded_token": "I"}}],
     "prompt_token_ids": [128000, 9906], "token_ids": [220, 16]},
    {"index": 1, "text": "!", "finish_reason": "length", "stop_reason": 128001, "logprobs": null,
     "prompt_logprobs": null, "prompt_token_ids": null, "token_ids": null},
    {"index": 2, "text": "", "finish_reason": "stop", "stop_reason": null, "logprobs": null}
  ],
  "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
  "activations": {"residual_stream": {"data": "AAAA", "dtype": "int16", "shape": [1, 1, 2], "compression": "zstd"}}
}`;

describe("toCompletionResponse", () => {
  const v = parseVllmCompletion(parseVllmJson(vllmText));
  const r = toCompletionResponse(v, "llama-8b");

  it("makes its own id, keeps the requested model and Inference's created", () => {
    expect(r.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(r.id).not.toContain("upstream");
    expect(toCompletionResponse(v, "llama-8b").id).not.toBe(r.id);
    expect(r.model).toBe("llama-8b");
    expect(r.created).toBe(1700000123n);
    expect(r.usage).toMatchObject({ promptTokens: 2, completionTokens: 4, totalTokens: 6 });
    expect(r.activations).toBeUndefined();
    expect(v.activations?.residual_stream).toMatchObject({ dtype: "int16", shape: [1, 1, 2] });
  });

  it("turns column-wise logprobs into rows, null → unset, dict order kept", () => {
    const rows = r.choices[0]?.logprobs?.content ?? [];
    expect(
      rows.map((t) => ({
        token: t.token,
        logprob: t.logprob,
        top: t.topLogprobs?.values.map((x) => [x.token, x.logprob]),
        offset: t.textOffset,
      })),
    ).toStrictEqual([
      { token: "Hello", logprob: undefined, top: undefined, offset: 0 },
      {
        token: " ",
        logprob: -0.5,
        top: [
          [" ", -0.5],
          ["1", -1.25],
        ],
        offset: 5,
      },
      {
        token: "1",
        logprob: -9999,
        top: [
          ["1", -9999],
          ["one", -3],
        ],
        offset: 6,
      },
    ]);
    expect(r.choices[1]?.logprobs).toBeUndefined();
  });

  it("maps finish and stop reasons: string → stopString, integer → stopTokenId, null → unset", () => {
    expect(
      r.choices.map((c) => [c.index, c.finishReason, c.stopReason.case, c.stopReason.value]),
    ).toStrictEqual([
      [0, FinishReason.STOP, "stopString", "\n"],
      [1, FinishReason.LENGTH, "stopTokenId", 128001],
      [2, FinishReason.STOP, undefined, undefined],
    ]);
  });

  it("maps prompt_logprobs (first null → empty, source order kept) and token ids", () => {
    const p = r.choices[0]?.promptLogprobs ?? [];
    expect(
      p.map((pos) => pos.values.map((x) => [x.tokenId, x.logprob, x.rank, x.decodedToken])),
    ).toStrictEqual([
      [],
      [
        [9906, -7.5, 12, "Hello"],
        [40, -1, 1, "I"],
      ],
    ]);
    expect(r.choices[0]?.promptTokenIds).toStrictEqual([128000, 9906]);
    expect(r.choices[0]?.tokenIds).toStrictEqual([220, 16]);
    expect(r.choices[1]?.promptLogprobs).toStrictEqual([]);
  });

  it("a choice aborted by the engine → 502 upstream_error", () => {
    const aborted = parseVllmCompletion({
      ...JSON.parse(vllmText),
      choices: [{ index: 0, text: "", finish_reason: "abort", stop_reason: null, logprobs: null }],
    });
    expect(() => toCompletionResponse(aborted, "m")).toThrow(ApiError);
    try {
      toCompletionResponse(aborted, "m");
    } catch (e) {
      expect((e as ApiError).code).toBe("upstream_error");
    }
  });

  it.each([
    [
      "columns of different length",
      { text_offset: [0], token_logprobs: [null, 1], tokens: ["a"], top_logprobs: null },
    ],
    ["a non-number logprob", { text_offset: [0], token_logprobs: ["x"], tokens: ["a"], top_logprobs: null }],
  ])("malformed logprobs (%s) → 502", (_, logprobs) => {
    const bad = {
      ...JSON.parse(vllmText),
      choices: [{ index: 0, text: "a", finish_reason: "stop", logprobs }],
    };
    expect(() => parseVllmCompletion(bad)).toThrow(ApiError);
  });
});

describe("toStreamChunk", () => {
  const ids = { id: "cmpl-0123456789abcdef0123456789abcdef", created: 1700000000n, model: "llama-8b" };

  it("uses the stream's ids; unfinished choices have UNSPECIFIED finish and no stop reason", () => {
    const c = parseVllmCompletionChunk({
      id: "cmpl-up",
      object: "text_completion",
      created: 5,
      model: "served/model",
      choices: [
        { index: 3, text: "é", logprobs: null, finish_reason: null, stop_reason: null, token_ids: [233] },
      ],
      usage: null,
    });
    const s = toStreamChunk(c, ids, new TextOffsets());
    expect([s.id, s.created, s.model]).toStrictEqual([ids.id, ids.created, ids.model]);
    expect(s.choices[0]).toMatchObject({
      index: 3,
      text: "é",
      finishReason: FinishReason.UNSPECIFIED,
      tokenIds: [233],
    });
    expect(s.choices[0]?.stopReason.case).toBeUndefined();
    expect(s.usage).toBeUndefined();
  });

  it("carries the usage chunk (choices: [])", () => {
    const c = parseVllmCompletionChunk({
      id: "x",
      object: "text_completion",
      created: 5,
      model: "m",
      choices: [],
      usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
    });
    const s = toStreamChunk(c, ids, new TextOffsets());
    expect(s.choices).toStrictEqual([]);
    expect(s.usage).toMatchObject({ promptTokens: 1, completionTokens: 2, totalTokens: 3 });
  });

  it("a last chunk with finish_reason length and a stop token id", () => {
    const c = parseVllmCompletionChunk({
      id: "x",
      object: "text_completion",
      created: 5,
      model: "m",
      choices: [{ index: 0, text: "", logprobs: null, finish_reason: "stop", stop_reason: 128009 }],
    });
    const s = toStreamChunk(c, ids, new TextOffsets());
    expect(s.choices[0]?.finishReason).toBe(FinishReason.STOP);
    expect(s.choices[0]?.stopReason).toStrictEqual({ case: "stopTokenId", value: 128009 });
  });

  it("builds the same messages as create() (fields, unset ones absent, key order, binary form)", () => {
    const c = parseVllmCompletionChunk({
      id: "x",
      object: "text_completion",
      created: 5,
      model: "m",
      choices: [
        {
          index: 1,
          text: " a",
          logprobs: {
            text_offset: [0],
            token_logprobs: [-0.5],
            tokens: [" a"],
            top_logprobs: [{ " a": -0.5 }],
          },
          finish_reason: "stop",
          stop_reason: "\n",
          prompt_token_ids: [1, 2],
          token_ids: [7],
        },
        { index: 0, text: "b", logprobs: null, finish_reason: null, stop_reason: null, token_ids: [8] },
      ],
      usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
    });
    const s = toStreamChunk(c, ids, new TextOffsets());
    const viaCreate = create(StreamCompletionResponseSchema, {
      ...ids,
      choices: s.choices.map(({ $typeName: _, ...init }) => create(CompletionChoiceSchema, init)),
      usage: create(UsageSchema, { promptTokens: 1, completionTokens: 2, totalTokens: 3 }),
    });
    expect(s).toStrictEqual(viaCreate);
    expect(Object.keys(s)).toStrictEqual(Object.keys(viaCreate));
    for (const [i, choice] of s.choices.entries()) {
      expect(Object.keys(choice)).toStrictEqual(Object.keys(viaCreate.choices[i]!));
    }
    expect(Object.keys(s.usage!)).toStrictEqual(Object.keys(viaCreate.usage!));
    expect(toBinary(StreamCompletionResponseSchema, s)).toStrictEqual(
      toBinary(StreamCompletionResponseSchema, viaCreate),
    );
    const none = toStreamChunk({ ...c, choices: [], usage: null }, ids, new TextOffsets());
    expect(none).toStrictEqual(create(StreamCompletionResponseSchema, { ...ids }));
    expect(Object.keys(none)).toStrictEqual(Object.keys(create(StreamCompletionResponseSchema, { ...ids })));
  });
});

describe("toCompletionResponse, built by hand", () => {
  it("builds the same message as create() (fields, unset ones absent, key order, binary form)", () => {
    for (const v of [
      parseVllmCompletion(parseVllmJson(vllmText)),
      { ...parseVllmCompletion(parseVllmJson(vllmText)), usage: null },
    ]) {
      const r = toCompletionResponse(v, "llama-8b");
      const viaCreate = create(CreateCompletionResponseSchema, {
        id: r.id,
        created: r.created,
        model: r.model,
        choices: r.choices.map(({ $typeName: _, ...init }) => create(CompletionChoiceSchema, init)),
        ...(v.usage === null
          ? {}
          : { usage: create(UsageSchema, { promptTokens: 2, completionTokens: 4, totalTokens: 6 }) }),
      });
      expect(r).toStrictEqual(viaCreate);
      expect(Object.keys(r)).toStrictEqual(Object.keys(viaCreate));
      expect(r.created).toBe(1700000123n);
      expect(toBinary(CreateCompletionResponseSchema, r)).toStrictEqual(
        toBinary(CreateCompletionResponseSchema, viaCreate),
      );
    }
  });
});
