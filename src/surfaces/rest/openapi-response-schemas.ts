// The response schemas of the OpenAPI document (src/surfaces/rest/openapi.ts), written out: the JSON that
// src/surfaces/rest/render-completion.ts and src/surfaces/rest/render-tokens.ts write (OpenAI's and vLLM's shapes),
// checked against the renderers by test/surfaces/rest/openapi.test.ts.
import { integerArray, type JsonSchema, orNull, ref } from "./openapi-json-schema.js";

/** The component schemas of the responses, by name. */
/** A reference to the Activations schema, with what it holds where it stands. */
const activations = (description: string): JsonSchema => ({ ...ref("Activations"), description });

/** The first properties of a choice, whole or streamed. */
const choiceHead: Readonly<Record<string, JsonSchema>> = {
  index: { type: "integer", minimum: 0 },
  text: { type: "string" },
  logprobs: orNull(ref("Logprobs")),
  finish_reason: ref("FinishReason"),
  stop_reason: ref("StopReason"),
};

export const responseSchemas: Readonly<Record<string, JsonSchema>> = {
  Activations: {
    type: "object",
    description: "What the request captured (vllm-lens).",
    required: ["residual_stream"],
    additionalProperties: false,
    properties: {
      residual_stream: {
        ...ref("EncodedTensor"),
        description:
          "Shape (layers ascending, positions, hidden); positions = prompt tokens + generated tokens − 1.",
      },
    },
  },
  Logprobs: {
    type: "object",
    description: "OpenAI's column-wise completions logprobs: one entry per token in each list.",
    required: ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
    additionalProperties: false,
    properties: {
      tokens: { type: "array", items: { type: "string" } },
      token_logprobs: {
        type: "array",
        items: orNull({ type: "number" }),
        description: "null for the first echoed prompt token.",
      },
      top_logprobs: {
        type: "array",
        items: orNull({ type: "object", additionalProperties: { type: "number" } }),
        description: "token → logprob of the top candidates; null for the first echoed prompt token.",
      },
      text_offset: {
        type: "array",
        items: { type: "integer", minimum: 0 },
        description: "Character offset of each token in the choice's text.",
      },
    },
  },
  PromptLogprobs: {
    type: "array",
    description:
      "vLLM's prompt logprobs: per prompt position, token id (as a key) → candidate; the first position is null.",
    items: orNull({
      type: "object",
      additionalProperties: {
        type: "object",
        required: ["logprob", "rank", "decoded_token"],
        additionalProperties: false,
        properties: {
          logprob: { type: "number" },
          rank: { type: "integer" },
          decoded_token: { type: "string" },
        },
      },
    }),
  },
  FinishReason: orNull({ enum: ["stop", "length"], description: "null until the choice's last chunk." }),
  StopReason: orNull({
    description:
      "The stop string or stop token id that ended the choice; null for EOS, length, or not finished.",
    oneOf: [{ type: "string" }, { type: "integer" }],
  }),
  CompletionChoice: {
    type: "object",
    description: "A choice; index = prompt_index × n + sample_index. Every key vLLM writes is present.",
    required: [
      "index",
      "text",
      "logprobs",
      "finish_reason",
      "stop_reason",
      "token_ids",
      "prompt_logprobs",
      "prompt_token_ids",
    ],
    additionalProperties: false,
    properties: {
      ...choiceHead,
      token_ids: orNull({ ...integerArray, description: "With return_token_ids." }),
      prompt_logprobs: orNull(ref("PromptLogprobs")),
      prompt_token_ids: orNull({ ...integerArray, description: "With return_token_ids." }),
      activations: activations(
        "A lens fan-out's capture (several prompts and/or n > 1 with output_residual_stream): this choice's own, proto/API.md §6.",
      ),
    },
  },
  CompletionStreamChoice: {
    type: "object",
    description: "The next text of one choice.",
    required: ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"],
    additionalProperties: false,
    properties: {
      ...choiceHead,
      prompt_token_ids: orNull({
        ...integerArray,
        description: "With return_token_ids, on a choice's first chunk.",
      }),
      token_ids: orNull({ ...integerArray, description: "With return_token_ids: this chunk's tokens." }),
      activations: activations(
        "A lens fan-out's capture: only in the choice's activations chunk (`text: \"\"`, every other key null), after its last text chunk once its replay is done.",
      ),
    },
  },
  Usage: {
    type: "object",
    required: ["prompt_tokens", "completion_tokens", "total_tokens"],
    additionalProperties: false,
    properties: {
      prompt_tokens: { type: "integer", minimum: 0 },
      completion_tokens: { type: "integer", minimum: 0 },
      total_tokens: { type: "integer", minimum: 0 },
      prompt_tokens_details: { type: "null", description: "As vLLM writes it (no cached-token count)." },
    },
  },
  Completion: {
    type: "object",
    description:
      "A non-streamed completion (`object: text_completion`, proto/API.md §5), with every key vLLM's CompletionResponse writes.",
    required: [
      "id",
      "object",
      "created",
      "model",
      "choices",
      "service_tier",
      "system_fingerprint",
      "usage",
      "kv_transfer_params",
    ],
    additionalProperties: false,
    properties: {
      id: { type: "string", pattern: "^cmpl-[0-9a-f]{32}$" },
      object: { const: "text_completion" },
      created: { type: "integer", description: "Unix seconds." },
      model: { type: "string", description: "As requested." },
      choices: { type: "array", items: ref("CompletionChoice") },
      service_tier: { type: "null" },
      system_fingerprint: { type: "null" },
      usage: orNull(ref("Usage")),
      kv_transfer_params: { type: "null" },
      activations: activations(
        "With output_residual_stream, one prompt and n = 1 (a fan-out has them on each choice).",
      ),
    },
  },
  CompletionChunk: {
    type: "object",
    description:
      "One `data:` event of a stream: the next text of one choice, the usage chunk (`choices: []`, with include_usage), or the activations chunk (`choices: []`, `activations`).",
    required: ["id", "object", "created", "model", "choices", "usage"],
    additionalProperties: false,
    properties: {
      id: { type: "string", pattern: "^cmpl-[0-9a-f]{32}$" },
      object: { const: "text_completion" },
      created: { type: "integer", description: "Unix seconds." },
      model: { type: "string" },
      choices: { type: "array", items: ref("CompletionStreamChoice") },
      usage: orNull(ref("Usage")),
      activations: ref("Activations"),
    },
  },
  CompletionStreamEvent: {
    description:
      "The JSON of a `data:` event: a chunk, or (after the stream started) the error envelope, followed by `data: [DONE]`.",
    oneOf: [ref("CompletionChunk"), ref("ErrorEnvelope")],
  },
  Model: {
    type: "object",
    description: "OpenAI's model object plus the gateway's facts (`acs.v1.Model`). One per id and per alias.",
    required: [
      "id",
      "object",
      "created",
      "owned_by",
      "root",
      "max_model_len",
      "aliases",
      "hidden_size",
      "num_hidden_layers",
    ],
    additionalProperties: false,
    properties: {
      id: { type: "string", description: "The name asked for: the id or an alias." },
      object: { const: "model" },
      created: { type: "integer", description: "Unix seconds." },
      owned_by: { type: "string" },
      root: { type: "string", description: "The model this name stands for (its id)." },
      max_model_len: { type: "integer", minimum: 1, description: "Longest prompt + completion, tokens." },
      aliases: { type: "array", items: { type: "string" } },
      hidden_size: { type: "integer", minimum: 0, description: "Residual stream width." },
      num_hidden_layers: { type: "integer", minimum: 0, description: "Decoder layers." },
    },
  },
  ModelList: {
    type: "object",
    required: ["object", "data"],
    additionalProperties: false,
    properties: { object: { const: "list" }, data: { type: "array", items: ref("Model") } },
  },
  TokenizeResponse: {
    type: "object",
    description: "vLLM's TokenizeResponse, as Inference counts the text (`acs.v1.TokenizeResponse`).",
    required: ["count", "max_model_len", "tokens", "token_strs"],
    additionalProperties: false,
    properties: {
      count: { type: "integer", minimum: 0 },
      max_model_len: { type: "integer", minimum: 1, description: "Longest prompt + completion, tokens." },
      tokens: integerArray,
      token_strs: orNull({
        type: "array",
        items: { type: "string" },
        description: "Each token's string when `return_token_strs` was true; else null.",
      }),
    },
  },
  DetokenizeResponse: {
    type: "object",
    description: "vLLM's DetokenizeResponse (`acs.v1.DetokenizeResponse`).",
    required: ["prompt"],
    additionalProperties: false,
    properties: { prompt: { type: "string", description: "The decoded text." } },
  },
  Readiness: {
    type: "object",
    required: ["status", "models"],
    additionalProperties: false,
    properties: {
      status: { enum: ["ready", "not_ready"] },
      models: {
        type: "object",
        additionalProperties: { enum: ["serving", "not_serving"] },
        description: "Model id → whether it serves.",
      },
      reasons: {
        type: "array",
        items: { type: "string" },
        description:
          "While not ready: why, one sentence each (draining; no model serves; the Budget ledger cannot write).",
      },
    },
  },
};
