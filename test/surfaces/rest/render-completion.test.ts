import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import {
  type CompletionChoiceSchema,
  CreateCompletionResponseSchema,
  FinishReason,
  ListModelsResponseSchema,
  StreamCompletionResponseSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { Dtype } from "../../../gen/acs/v1/lens_pb.js";
import {
  renderChunk,
  renderCompletion,
  renderModel,
  renderModelList,
} from "../../../src/surfaces/rest/render-completion.js";

// The tensor codec is src/lens's (its own tests check it); here the residual stream is rendered
// as vllm-lens's dict by the real codec. Bytes counted up, so that the base64 is not trivial.
const counting = (n: number) => Uint8Array.from({ length: n }, (_, i) => i);
const base64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");

const head = { id: "cmpl-0123456789abcdef0123456789abcdef", created: 1_700_000_000n, model: "llama-8b" };
const headJson = { id: head.id, object: "text_completion", created: 1_700_000_000, model: "llama-8b" };
type ChoiceInit = NonNullable<Parameters<typeof create<typeof CompletionChoiceSchema>>[1]>;

// Every key of vLLM's CompletionResponseChoice, null unless asked for.
const nulls = { token_ids: null, prompt_logprobs: null, prompt_token_ids: null };

const choiceCases: {
  name: string;
  choice: ChoiceInit;
  returnTokenIds?: boolean;
  json: Record<string, unknown>;
}[] = [
  {
    name: "plain choice finished by length",
    choice: { index: 0, text: " blue", finishReason: FinishReason.LENGTH },
    json: { index: 0, text: " blue", logprobs: null, finish_reason: "length", stop_reason: null, ...nulls },
  },
  {
    name: "stopped by a stop string",
    choice: {
      index: 3,
      text: "a",
      finishReason: FinishReason.STOP,
      stopReason: { case: "stopString", value: "\n" },
    },
    json: { index: 3, text: "a", logprobs: null, finish_reason: "stop", stop_reason: "\n", ...nulls },
  },
  {
    name: "stopped by a stop token id",
    choice: {
      index: 1,
      text: "",
      finishReason: FinishReason.STOP,
      stopReason: { case: "stopTokenId", value: 128009 },
    },
    json: { index: 1, text: "", logprobs: null, finish_reason: "stop", stop_reason: 128009, ...nulls },
  },
  {
    name: "stopped by EOS",
    choice: { text: "x", finishReason: FinishReason.STOP },
    json: { index: 0, text: "x", logprobs: null, finish_reason: "stop", stop_reason: null, ...nulls },
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
      ...nulls,
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
      ...nulls,
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
    returnTokenIds: true,
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
    name: "return_token_ids with no token generated: an empty list, not null",
    choice: { text: "", finishReason: FinishReason.LENGTH, promptTokenIds: [1] },
    returnTokenIds: true,
    json: {
      index: 0,
      text: "",
      logprobs: null,
      finish_reason: "length",
      stop_reason: null,
      token_ids: [],
      prompt_logprobs: null,
      prompt_token_ids: [1],
    },
  },
];

describe("renderCompletion", () => {
  it.each(choiceCases)("$name", ({ choice, returnTokenIds, json }) => {
    const res = create(CreateCompletionResponseSchema, {
      ...head,
      choices: [choice],
      usage: { promptTokens: 4, completionTokens: 1, totalTokens: 5 },
    });
    expect(
      JSON.parse(JSON.stringify(renderCompletion(res, { returnTokenIds: returnTokenIds ?? false }))),
    ).toStrictEqual({
      ...headJson,
      choices: [json],
      service_tier: null,
      system_fingerprint: null,
      usage: { prompt_tokens: 4, completion_tokens: 1, total_tokens: 5, prompt_tokens_details: null },
      kv_transfer_params: null,
    });
  });

  it("adds activations.residual_stream (the vllm-lens dict) only when present", () => {
    const withActivations = create(CreateCompletionResponseSchema, {
      ...head,
      usage: { promptTokens: 1, completionTokens: 1, totalTokens: 2 },
      activations: { residualStream: { dtype: Dtype.BFLOAT16, shape: [2, 3, 4], data: counting(48) } },
    });
    expect(renderCompletion(withActivations, { returnTokenIds: false }).activations).toEqual({
      residual_stream: {
        data: base64(counting(48)),
        dtype: "int16",
        original_dtype: "torch.bfloat16",
        shape: [2, 3, 4],
        compression: null,
      },
    });
    const without = renderCompletion(create(CreateCompletionResponseSchema, head), { returnTokenIds: false });
    expect(Object.keys(without).sort()).toEqual([
      "choices",
      "created",
      "id",
      "kv_transfer_params",
      "model",
      "object",
      "service_tier",
      "system_fingerprint",
      "usage",
    ]);
    expect(without.usage).toBeNull();
  });
});

describe("renderChunk", () => {
  const usage = { promptTokens: 3, completionTokens: 7, totalTokens: 10 };
  const usageJson = { prompt_tokens: 3, completion_tokens: 7, total_tokens: 10 };
  const choice = { index: 0, text: "a" };
  // Every key of vLLM's CompletionResponseStreamChoice, null unless asked for.
  const choiceJson = {
    index: 0,
    text: "a",
    logprobs: null,
    finish_reason: null,
    stop_reason: null,
    prompt_token_ids: null,
    token_ids: null,
  };

  it.each([
    {
      name: "text chunk: usage null (as vLLM writes every chunk)",
      chunk: { choices: [choice] },
      json: { choices: [choiceJson], usage: null },
    },
    {
      name: "usage chunk: no prompt_tokens_details (vLLM drops nulls there)",
      chunk: { choices: [], usage },
      json: { choices: [], usage: usageJson },
    },
    {
      name: "continuous usage on a text chunk, with prompt_tokens_details null",
      chunk: { choices: [choice], usage },
      json: { choices: [choiceJson], usage: { ...usageJson, prompt_tokens_details: null } },
    },
    {
      name: "return_token_ids: the first chunk of a choice carries the prompt's ids",
      chunk: { choices: [{ ...choice, promptTokenIds: [1, 2], tokenIds: [3] }] },
      returnTokenIds: true,
      json: { choices: [{ ...choiceJson, prompt_token_ids: [1, 2], token_ids: [3] }], usage: null },
    },
    {
      name: "return_token_ids: later chunks have prompt_token_ids null, token_ids a list (maybe empty)",
      chunk: { choices: [{ ...choice, tokenIds: [] }] },
      returnTokenIds: true,
      json: { choices: [{ ...choiceJson, token_ids: [] }], usage: null },
    },
    {
      name: "activations chunk",
      chunk: {
        activations: { residualStream: { dtype: Dtype.FLOAT32, shape: [1, 2, 3], data: counting(24) } },
      },
      json: {
        choices: [],
        usage: null,
        activations: {
          residual_stream: {
            data: base64(counting(24)),
            dtype: "float32",
            original_dtype: "torch.float32",
            shape: [1, 2, 3],
            compression: null,
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
      json: {
        choices: [{ ...choiceJson, index: 1, text: "", finish_reason: "stop", stop_reason: "." }],
        usage: null,
      },
    },
  ])("$name", ({ chunk, returnTokenIds, json }) => {
    const rendered = renderChunk(create(StreamCompletionResponseSchema, { ...head, ...chunk }), {
      returnTokenIds: returnTokenIds ?? false,
    });
    expect(JSON.parse(JSON.stringify(rendered))).toStrictEqual({ ...headJson, ...json });
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
