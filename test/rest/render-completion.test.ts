import { create } from "@bufbuild/protobuf";
import { describe, expect, it, vi } from "vitest";
import {
  type CompletionChoiceSchema,
  CreateCompletionResponseSchema,
  FinishReason,
  ListModelsResponseSchema,
  StreamCompletionResponseSchema,
} from "../../gen/acs/v1/completions_pb.js";
import { Dtype } from "../../gen/acs/v1/lens_pb.js";
import {
  renderChunk,
  renderCompletion,
  renderModel,
  renderModelList,
} from "../../src/rest/render-completion.js";

// The tensor codec is src/lens's unit; here it only has to be applied to the residual stream.
vi.mock("../../src/lens/index.js", () => ({
  tensorToVllmLensJson: (tensor: { shape: number[]; dtype: number }) => ({
    data: "stub",
    dtype: "float32",
    shape: [...tensor.shape],
    compression: null,
    seenDtype: tensor.dtype,
  }),
}));

const head = { id: "cmpl-0123456789abcdef0123456789abcdef", created: 1_700_000_000n, model: "llama-8b" };
const headJson = { id: head.id, object: "text_completion", created: 1_700_000_000, model: "llama-8b" };
type ChoiceInit = NonNullable<Parameters<typeof create<typeof CompletionChoiceSchema>>[1]>;

const choiceCases: { name: string; choice: ChoiceInit; json: Record<string, unknown> }[] = [
  {
    name: "plain choice finished by length",
    choice: { index: 0, text: " blue", finishReason: FinishReason.LENGTH },
    json: { index: 0, text: " blue", logprobs: null, finish_reason: "length", stop_reason: null },
  },
  {
    name: "stopped by a stop string",
    choice: {
      index: 3,
      text: "a",
      finishReason: FinishReason.STOP,
      stopReason: { case: "stopString", value: "\n" },
    },
    json: { index: 3, text: "a", logprobs: null, finish_reason: "stop", stop_reason: "\n" },
  },
  {
    name: "stopped by a stop token id",
    choice: {
      index: 1,
      text: "",
      finishReason: FinishReason.STOP,
      stopReason: { case: "stopTokenId", value: 128009 },
    },
    json: { index: 1, text: "", logprobs: null, finish_reason: "stop", stop_reason: 128009 },
  },
  {
    name: "stopped by EOS",
    choice: { text: "x", finishReason: FinishReason.STOP },
    json: { index: 0, text: "x", logprobs: null, finish_reason: "stop", stop_reason: null },
  },
  {
    name: "logprobs rows become columns; an echoed first token has nulls",
    choice: {
      text: "The sky",
      finishReason: FinishReason.LENGTH,
      logprobs: {
        content: [
          { token: "The", textOffset: 0 },
          {
            token: " sky",
            logprob: -1.5,
            textOffset: 3,
            topLogprobs: {
              values: [
                { token: " sky", logprob: -1.5 },
                { token: "__proto__", logprob: -2 },
              ],
            },
          },
        ],
      },
    },
    json: {
      index: 0,
      text: "The sky",
      logprobs: {
        tokens: ["The", " sky"],
        token_logprobs: [null, -1.5],
        top_logprobs: [null, { " sky": -1.5, ["__proto__"]: -2 }],
        text_offset: [0, 3],
      },
      finish_reason: "length",
      stop_reason: null,
    },
  },
  {
    name: "empty logprobs (asked, no tokens) stay an object",
    choice: { text: "", logprobs: { content: [] }, finishReason: FinishReason.LENGTH },
    json: {
      index: 0,
      text: "",
      logprobs: { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] },
      finish_reason: "length",
      stop_reason: null,
    },
  },
  {
    name: "prompt_logprobs (first null) and token ids",
    choice: {
      text: "!",
      finishReason: FinishReason.LENGTH,
      promptLogprobs: [
        { values: [] },
        {
          values: [
            { tokenId: 791, logprob: -0.25, rank: 1, decodedToken: "The" },
            { tokenId: 32, logprob: -3, rank: 2, decodedToken: "A" },
          ],
        },
      ],
      promptTokenIds: [128000, 791],
      tokenIds: [0],
    },
    json: {
      index: 0,
      text: "!",
      logprobs: null,
      finish_reason: "length",
      stop_reason: null,
      prompt_logprobs: [
        null,
        {
          "791": { logprob: -0.25, rank: 1, decoded_token: "The" },
          "32": { logprob: -3, rank: 2, decoded_token: "A" },
        },
      ],
      prompt_token_ids: [128000, 791],
      token_ids: [0],
    },
  },
  {
    name: "stream chunk of an unfinished choice: finish_reason and stop_reason null",
    choice: { index: 2, text: " next", tokenIds: [5, 6] },
    json: {
      index: 2,
      text: " next",
      logprobs: null,
      finish_reason: null,
      stop_reason: null,
      token_ids: [5, 6],
    },
  },
];

describe("renderCompletion", () => {
  it.each(choiceCases)("$name", ({ choice, json }) => {
    const res = create(CreateCompletionResponseSchema, {
      ...head,
      choices: [choice],
      usage: { promptTokens: 4, completionTokens: 1, totalTokens: 5 },
    });
    expect(JSON.parse(JSON.stringify(renderCompletion(res)))).toEqual({
      ...headJson,
      choices: [json],
      usage: { prompt_tokens: 4, completion_tokens: 1, total_tokens: 5 },
    });
  });

  it("adds activations.residual_stream (the vllm-lens dict) only when present", () => {
    const withActivations = create(CreateCompletionResponseSchema, {
      ...head,
      usage: { promptTokens: 1, completionTokens: 1, totalTokens: 2 },
      activations: { residualStream: { dtype: Dtype.BFLOAT16, shape: [2, 3, 4], data: new Uint8Array(48) } },
    });
    expect(renderCompletion(withActivations).activations).toEqual({
      residual_stream: {
        data: "stub",
        dtype: "float32",
        shape: [2, 3, 4],
        compression: null,
        seenDtype: Dtype.BFLOAT16,
      },
    });
    const without = renderCompletion(create(CreateCompletionResponseSchema, head));
    expect(Object.keys(without).sort()).toEqual(["choices", "created", "id", "model", "object", "usage"]);
    expect(without.usage).toBeNull();
  });
});

describe("renderChunk", () => {
  const usage = { promptTokens: 3, completionTokens: 7, totalTokens: 10 };
  const usageJson = { prompt_tokens: 3, completion_tokens: 7, total_tokens: 10 };
  const choice = { index: 0, text: "a" };
  const choiceJson = { index: 0, text: "a", logprobs: null, finish_reason: null, stop_reason: null };

  it.each([
    {
      name: "text chunk without include_usage",
      chunk: { choices: [choice] },
      includeUsage: false,
      json: { choices: [choiceJson] },
    },
    {
      name: "text chunk with include_usage: usage null",
      chunk: { choices: [choice] },
      includeUsage: true,
      json: { choices: [choiceJson], usage: null },
    },
    {
      name: "usage chunk",
      chunk: { choices: [], usage },
      includeUsage: true,
      json: { choices: [], usage: usageJson },
    },
    {
      name: "continuous usage on a text chunk",
      chunk: { choices: [choice], usage },
      includeUsage: false,
      json: { choices: [choiceJson], usage: usageJson },
    },
    {
      name: "activations chunk",
      chunk: {
        activations: { residualStream: { dtype: Dtype.FLOAT32, shape: [1, 2, 3], data: new Uint8Array(24) } },
      },
      includeUsage: false,
      json: {
        choices: [],
        activations: {
          residual_stream: {
            data: "stub",
            dtype: "float32",
            shape: [1, 2, 3],
            compression: null,
            seenDtype: Dtype.FLOAT32,
          },
        },
      },
    },
    {
      name: "last chunk of a choice",
      chunk: {
        choices: [
          {
            index: 1,
            text: "",
            finishReason: FinishReason.STOP,
            stopReason: { case: "stopString" as const, value: "." },
          },
        ],
      },
      includeUsage: false,
      json: { choices: [{ index: 1, text: "", logprobs: null, finish_reason: "stop", stop_reason: "." }] },
    },
  ])("$name", ({ chunk, includeUsage, json }) => {
    const rendered = renderChunk(create(StreamCompletionResponseSchema, { ...head, ...chunk }), {
      includeUsage,
    });
    expect(JSON.parse(JSON.stringify(rendered))).toEqual({ ...headJson, ...json });
  });
});

describe("renderModel / renderModelList", () => {
  it("renders OpenAI's model object with the gateway's facts", () => {
    const list = create(ListModelsResponseSchema, {
      data: [
        {
          id: "meta-llama/Llama-3.1-8B",
          created: 1_720_000_000n,
          ownedBy: "acs",
          aliases: ["llama-8b"],
          maxModelLen: 131072,
          hiddenSize: 4096,
          numHiddenLayers: 32,
        },
      ],
    });
    const model = {
      id: "meta-llama/Llama-3.1-8B",
      object: "model",
      created: 1_720_000_000,
      owned_by: "acs",
      root: "meta-llama/Llama-3.1-8B",
      max_model_len: 131072,
      aliases: ["llama-8b"],
      hidden_size: 4096,
      num_hidden_layers: 32,
    };
    const alias = { ...model, id: "llama-8b" };
    // one entry per name a request may use as `model`
    expect(renderModelList(list)).toEqual({ object: "list", data: [model, alias] });
    expect(renderModel(list.data[0]!)).toEqual(model);
    expect(renderModel(list.data[0]!, "llama-8b")).toEqual(alias);
  });
});
