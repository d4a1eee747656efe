import { type ErrorCode, errorCatalogue } from "../errors/index.js";

/**
 * The OpenAPI 3.1 document of the REST surface (proto/API.md §1–§9), served at `GET /openapi.json`
 * and rendered at `GET /docs`.
 *
 * Kept in this one file beside the REST code; what can be derived is derived: the error codes,
 * their HTTP statuses and OpenAI types come from the error catalogue (src/errors/catalogue.ts).
 * test/rest/openapi.test.ts checks the rest against the protos (every field of
 * `acs.v1.CreateCompletionRequest`, `SteeringVector` and `Model` under its REST JSON name) and
 * against the REST decoder and renderers, and validates the document with an OpenAPI 3.1 schema
 * validator; the end-to-end tests validate every REST response they get against it
 * (test/helpers/openapi-check.ts).
 *
 * A stream (`text/event-stream`) has no JSON schema of its own in OpenAPI 3.1: its media type
 * carries `x-sse-data`, the schema of each `data:` event's JSON (a chunk, or the error envelope);
 * the events end with `data: [DONE]`.
 */
export type OpenApiDocument = {
  readonly openapi: string;
  readonly paths: Record<string, Record<string, OpenApiOperation>>;
  readonly components: { readonly schemas: Record<string, JsonSchema> } & Record<string, unknown>;
} & Record<string, unknown>;

/** A JSON Schema (2020-12, the dialect of OpenAPI 3.1), or a `$ref`. */
export type JsonSchema = Record<string, unknown>;

/** An operation of the document, as far as its checkers read it. */
export interface OpenApiOperation {
  readonly operationId: string;
  readonly responses: Record<string, OpenApiResponse | { readonly $ref: string }>;
  readonly [key: string]: unknown;
}

/** A response: its headers and content by media type. */
export interface OpenApiResponse {
  readonly description: string;
  readonly headers?: Record<string, unknown>;
  readonly content?: Record<string, { readonly schema: JsonSchema; readonly "x-sse-data"?: JsonSchema }>;
}

const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });
/** `schema`, or null ("left out" in a request; "not asked for" in a response). */
const orNull = (schema: JsonSchema): JsonSchema => ({ anyOf: [schema, { type: "null" }] });
const INT32 = { type: "integer", minimum: -(2 ** 31), maximum: 2 ** 31 - 1 } as const;
const integerArray = { type: "array", items: { type: "integer" } } as const;

/** Every code a caller can be answered with (`canceled` is never rendered: the caller is gone). */
const renderedCodes = (Object.keys(errorCatalogue) as ErrorCode[]).filter((code) => code !== "canceled");

/** The codes of the catalogue answered with `status`. */
export function errorCodesOfStatus(status: number): ErrorCode[] {
  return renderedCodes.filter((code) => errorCatalogue[code].status === status);
}

/** The HTTP statuses of the error catalogue, ascending. */
export const errorStatuses: readonly number[] = [
  ...new Set(renderedCodes.map((code) => errorCatalogue[code].status)),
].sort((a, b) => a - b);

const statusText: Record<number, string> = {
  400: "Bad request: malformed JSON, an unknown field, a wrong type, a value out of range (proto/API.md §2–§4).",
  401: "The API key is missing or not valid.",
  403: "The key may not use this model.",
  404: "Unknown model or route.",
  405: "The route does not take this method (`Allow` lists the ones it takes).",
  413: "The body is over 8 MiB (after Content-Encoding is decoded), or a steering tensor is over its bound.",
  415: "The body is not `application/json`, or its Content-Encoding is not gzip, deflate or br.",
  429: "The key's Budget is spent (`insufficient_quota`, `x-should-retry: false`), or the request must wait (`rate_limited`, `Retry-After`).",
  500: "The gateway had an error.",
  502: "Inference answered with an error of its own.",
  503: "Inference is unavailable, or the gateway is shutting down.",
  504: "The deadline passed (14 minutes without a stream, or the caller's).",
};

/** `ErrorNNN`: the envelope, its `code` and `type` restricted to the catalogue's for `status`. */
function errorResponse(status: number): OpenApiResponse {
  const codes = errorCodesOfStatus(status);
  const types = [...new Set(codes.map((code) => errorCatalogue[code].type))];
  const headers: Record<string, unknown> = { "X-Request-Id": { $ref: "#/components/headers/X-Request-Id" } };
  if (status === 429) {
    headers["x-should-retry"] = { $ref: "#/components/headers/x-should-retry" };
    headers["Retry-After"] = { $ref: "#/components/headers/Retry-After" };
  }
  if (status === 405) headers.Allow = { $ref: "#/components/headers/Allow" };
  return {
    description: `${statusText[status] ?? "Error."} Codes: ${codes.map((c) => `\`${c}\``).join(", ")}.`,
    headers,
    content: {
      "application/json": {
        schema: {
          allOf: [
            ref("ErrorEnvelope"),
            {
              type: "object",
              properties: {
                error: {
                  type: "object",
                  properties: { code: { enum: codes }, type: { enum: types } },
                },
              },
            },
          ],
        },
      },
    },
  };
}

const errorResponseRef = (status: number) => ({ $ref: `#/components/responses/Error${status}` });
const errorsOf = (...statuses: number[]) =>
  Object.fromEntries(statuses.map((status) => [String(status), errorResponseRef(status)]));

const requestIdHeader = { "X-Request-Id": { $ref: "#/components/headers/X-Request-Id" } };

const tensor: JsonSchema = {
  description:
    "A tensor (proto/API.md §6): plain nested number arrays (2D or 3D, rectangular, finite, float32 range), or the vllm-lens encoded object. bf16 travels as int16 bits.",
  oneOf: [
    {
      title: "nested arrays",
      type: "array",
      items: {
        type: "array",
        items: { anyOf: [{ type: "number" }, { type: "array", items: { type: "number" } }] },
      },
    },
    ref("EncodedTensor"),
  ],
};

const schemas: Record<string, JsonSchema> = {
  CompletionRequest: {
    type: "object",
    description:
      "The body of `POST /v1/completions` (proto/API.md §2): `acs.v1.CreateCompletionRequest` under its REST JSON names, plus `stream`. `null` means left out, for every field. Unknown fields are refused (400, param = the field). Ranges and cross-field rules are the service's (same as on Connect).",
    required: ["model", "prompt"],
    additionalProperties: false,
    properties: {
      model: {
        type: "string",
        description: "A served model id or alias (e.g. `llama-8b`). Unknown → 404 `model_not_found`.",
      },
      prompt: {
        description: "Non-empty: a string, strings, token ids (integers ≥ 0), or lists of token ids.",
        oneOf: [
          { type: "string" },
          { type: "array", items: { type: "string" } },
          { type: "array", items: { type: "integer", minimum: 0 } },
          { type: "array", items: { type: "array", items: { type: "integer", minimum: 0 } } },
        ],
      },
      max_tokens: orNull({
        ...INT32,
        minimum: 1,
        description:
          "Tokens to generate per choice (proto/API.md §3). Default: what fits the context, at most 32,000 (15,600 without `stream`); required with several prompts or n > 1.",
      }),
      n: orNull({
        ...INT32,
        minimum: 1,
        maximum: 128,
        default: 1,
        description: "Choices per prompt; > 1 refused when temperature < 0.00001.",
      }),
      temperature: orNull({ type: "number", minimum: 0, maximum: 2, default: 1 }),
      top_p: orNull({ type: "number", exclusiveMinimum: 0, maximum: 1, default: 1 }),
      stop: orNull({
        description: "At most 4 non-empty strings.",
        oneOf: [{ type: "string" }, { type: "array", items: { type: "string" }, maxItems: 4 }],
      }),
      stream: orNull({
        type: "boolean",
        default: false,
        description: "`true`: the answer is a `text/event-stream` of chunks.",
      }),
      stream_options: orNull({
        type: "object",
        description: "Only with `stream: true`.",
        additionalProperties: false,
        properties: {
          include_usage: orNull({
            type: "boolean",
            description: "A last chunk with `choices: []` and the usage.",
          }),
          continuous_usage_stats: orNull({
            type: "boolean",
            description:
              "With include_usage: every chunk carries the usage so far of its choice (vLLM: its prompt's tokens and what it generated so far).",
          }),
        },
      }),
      logprobs: orNull({ ...INT32, minimum: 0, maximum: 20, description: "Top candidates per token." }),
      echo: orNull({ type: "boolean", default: false }),
      presence_penalty: orNull({ type: "number", minimum: -2, maximum: 2, default: 0 }),
      frequency_penalty: orNull({ type: "number", minimum: -2, maximum: 2, default: 0 }),
      seed: orNull({
        type: "integer",
        description: "−2^63 … 2^63−1, kept exact (never rounded through a double).",
      }),
      user: orNull({ type: "string", maxLength: 256 }),
      top_k: orNull({ ...INT32, minimum: -1, default: 0, description: "−1 or 0 = off (vLLM)." }),
      min_p: orNull({ type: "number", minimum: 0, maximum: 1, default: 0 }),
      repetition_penalty: orNull({ type: "number", exclusiveMinimum: 0, maximum: 2, default: 1 }),
      min_tokens: orNull({ ...INT32, minimum: 0, default: 0, description: "≤ max_tokens." }),
      ignore_eos: orNull({ type: "boolean", default: false }),
      stop_token_ids: orNull({ type: "array", items: { type: "integer", minimum: 0 } }),
      include_stop_str_in_output: orNull({ type: "boolean", default: false }),
      skip_special_tokens: orNull({ type: "boolean", default: true }),
      spaces_between_special_tokens: orNull({ type: "boolean", default: true }),
      add_special_tokens: orNull({ type: "boolean", default: true }),
      prompt_logprobs: orNull({
        ...INT32,
        minimum: 0,
        maximum: 20,
        description: "Refused with `stream: true`.",
      }),
      return_token_ids: orNull({
        type: "boolean",
        default: false,
        description: "Adds `prompt_token_ids` and `token_ids` to each choice.",
      }),
      priority: orNull({
        description: 'Lower is served earlier (vLLM). An integer, or a string holding one (`"2"`).',
        default: 0,
        oneOf: [INT32, { type: "string", pattern: "^-?[0-9]+$" }],
      }),
      output_residual_stream: orNull({
        description:
          "Capture the residual stream (vllm-lens): layer indices (unique, each in [0, layers)), or `true` for all layers. The answer then carries `activations`.",
        oneOf: [
          { type: "array", items: { type: "integer", minimum: 0 }, uniqueItems: true },
          { const: true },
        ],
      }),
      apply_steering_vectors: orNull({ type: "array", items: ref("SteeringVector") }),
    },
  },
  SteeringVector: {
    type: "object",
    description: "A vector added to the residual stream (vllm-lens, proto/API.md §6).",
    required: ["activations", "layer_indices"],
    additionalProperties: false,
    properties: {
      activations: {
        ...tensor,
        description:
          "2D (layers, hidden): added at every position; or 3D (layers, positions, hidden). Last dim = the model's hidden_size.",
      },
      layer_indices: {
        type: "array",
        items: { type: "integer", minimum: 0 },
        minItems: 1,
        uniqueItems: true,
        description: "One per row of activations.",
      },
      scale: orNull({ type: "number", default: 1 }),
      norm_match: orNull({
        type: "boolean",
        default: false,
        description: "Scale the added vector to ‖residual‖ · scale per token.",
      }),
      position_indices: orNull({
        type: "array",
        items: { type: "integer", minimum: 0 },
        description: "3D only; one per position (default 0…n−1); each < max_model_len.",
      }),
    },
  },
  EncodedTensor: {
    type: "object",
    description: "A tensor as vllm-lens writes it: little-endian C-order bytes in base64.",
    required: ["data", "dtype", "shape"],
    additionalProperties: false,
    properties: {
      data: {
        type: "string",
        contentEncoding: "base64",
        description: "Standard base64 of the bytes (one zstd frame when `compression` is `zstd`).",
      },
      dtype: {
        enum: ["float32", "float16", "int16"],
        description: "Storage dtype; bfloat16 is stored as int16 bits.",
      },
      original_dtype: { type: "string", examples: ["torch.bfloat16"], description: "The torch dtype." },
      shape: {
        type: "array",
        items: { type: "integer", minimum: 0 },
        description: "Dimensions, outermost first.",
      },
      compression: orNull({ const: "zstd" }),
    },
  },
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
      index: { type: "integer", minimum: 0 },
      text: { type: "string" },
      logprobs: orNull(ref("Logprobs")),
      finish_reason: ref("FinishReason"),
      stop_reason: ref("StopReason"),
      token_ids: orNull({ ...integerArray, description: "With return_token_ids." }),
      prompt_logprobs: orNull(ref("PromptLogprobs")),
      prompt_token_ids: orNull({ ...integerArray, description: "With return_token_ids." }),
      activations: {
        ...ref("Activations"),
        description:
          "A lens fan-out's capture (several prompts and/or n > 1 with output_residual_stream): this choice's own, proto/API.md §6.",
      },
    },
  },
  CompletionStreamChoice: {
    type: "object",
    description: "The next text of one choice.",
    required: ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"],
    additionalProperties: false,
    properties: {
      index: { type: "integer", minimum: 0 },
      text: { type: "string" },
      logprobs: orNull(ref("Logprobs")),
      finish_reason: ref("FinishReason"),
      stop_reason: ref("StopReason"),
      prompt_token_ids: orNull({
        ...integerArray,
        description: "With return_token_ids, on a choice's first chunk.",
      }),
      token_ids: orNull({ ...integerArray, description: "With return_token_ids: this chunk's tokens." }),
      activations: {
        ...ref("Activations"),
        description:
          "A lens fan-out's capture: only in the choice's activations chunk (`text: \"\"`, every other key null), after its last text chunk once its replay is done.",
      },
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
      activations: {
        ...ref("Activations"),
        description: "With output_residual_stream, one prompt and n = 1 (a fan-out has them on each choice).",
      },
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
  TokenizeRequest: {
    type: "object",
    description:
      "The body of vLLM's `POST /tokenize` (`acs.v1.TokenizeRequest`; vLLM's chat form with `messages` is not served). Decoded as a completion's body: unknown fields refused, `null` means left out.",
    required: ["model", "prompt"],
    additionalProperties: false,
    properties: {
      model: { type: "string", minLength: 1, description: "A model id or alias, as in a completion." },
      prompt: { type: "string", description: "The text (may be empty)." },
      add_special_tokens: orNull({
        type: "boolean",
        description: "Add BOS, as a completion's prompt gets it. Default true.",
      }),
      return_token_strs: orNull({
        type: "boolean",
        description: "Also return each token's string. Default false.",
      }),
    },
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
  DetokenizeRequest: {
    type: "object",
    description: "The body of vLLM's `POST /detokenize` (`acs.v1.DetokenizeRequest`).",
    required: ["model", "tokens"],
    additionalProperties: false,
    properties: {
      model: { type: "string", minLength: 1, description: "A model id or alias, as in a completion." },
      tokens: {
        type: "array",
        minItems: 1,
        items: { ...INT32, minimum: 0 },
        description: "Token ids; one outside the vocabulary is refused by Inference (400).",
      },
    },
  },
  DetokenizeResponse: {
    type: "object",
    description: "vLLM's DetokenizeResponse (`acs.v1.DetokenizeResponse`).",
    required: ["prompt"],
    additionalProperties: false,
    properties: { prompt: { type: "string", description: "The decoded text." } },
  },
  ErrorEnvelope: {
    type: "object",
    description:
      "Every refusal, on every surface (proto/API.md §7). Connect/gRPC carry the same fields as the `acs.v1.ErrorEnvelope` detail.",
    required: ["error", "request_id"],
    additionalProperties: false,
    properties: {
      error: {
        type: "object",
        required: ["message", "type", "param", "code"],
        additionalProperties: false,
        properties: {
          message: { type: "string" },
          type: { enum: [...new Set(renderedCodes.map((code) => errorCatalogue[code].type))] },
          param: orNull({
            type: "string",
            description:
              "The request field at fault (dotted path for nested ones, e.g. `apply_steering_vectors[0].scale`).",
          }),
          code: orNull({ enum: renderedCodes, description: "The gateway always sets one." }),
        },
      },
      request_id: {
        type: "string",
        pattern: "^req_[0-9a-f]{32}$",
        description: "Also the response's X-Request-Id.",
      },
    },
  },
};

const completionsOperation: OpenApiOperation = {
  operationId: "createCompletion",
  tags: ["completions"],
  summary: "Create a completion (JSON, or an SSE stream with `stream: true`)",
  description:
    "OpenAI's completions API for base models, with vLLM's sampling fields and vllm-lens activations (`output_residual_stream`) and steering (`apply_steering_vectors`). Every check runs before the first byte of a stream, so a refusal is a real HTTP status; an error after the stream started is one `data:` event holding the envelope, then `data: [DONE]`. The body may be sent with `Content-Encoding: gzip`, `deflate` or `br` (8 MiB after decoding).",
  requestBody: {
    required: true,
    content: {
      "application/json": {
        schema: ref("CompletionRequest"),
        examples: {
          text: {
            summary: "A completion",
            value: { model: "llama-8b", prompt: "The sky is", max_tokens: 8 },
          },
          stream: {
            summary: "A stream with its usage",
            value: {
              model: "llama-8b",
              prompt: "The sky is",
              max_tokens: 8,
              stream: true,
              stream_options: { include_usage: true },
            },
          },
          activations: {
            summary: "The residual stream of layers 15 and 20",
            value: {
              model: "llama-8b",
              prompt: "The sky is",
              max_tokens: 4,
              output_residual_stream: [15, 20],
            },
          },
        },
      },
    },
  },
  responses: {
    "200": {
      description:
        "The completion; with `stream: true`, `text/event-stream` events (`data: <chunk JSON>` … `data: [DONE]`, and `: keepalive` comments every 5 s; no `event:`, `id:` or `retry:` lines).",
      headers: {
        ...requestIdHeader,
        "X-Acs-Max-Tokens-Clamped": { $ref: "#/components/headers/X-Acs-Max-Tokens-Clamped" },
      },
      content: {
        "application/json": { schema: ref("Completion") },
        "text/event-stream": {
          schema: {
            type: "string",
            description: "Server-sent events; each `data:` is a CompletionStreamEvent, the last is `[DONE]`.",
          },
          "x-sse-data": ref("CompletionStreamEvent"),
        },
      },
    },
    ...errorsOf(400, 401, 403, 404, 413, 415, 429, 500, 502, 503, 504),
  },
};

/** vLLM's `/tokenize` or `/detokenize`: a completion's key and model checks, then Inference. */
function tokensOperation(
  name: "tokenize" | "detokenize",
  summary: string,
  example: unknown,
): OpenApiOperation {
  const type = name === "tokenize" ? "Tokenize" : "Detokenize";
  return {
    operationId: name,
    tags: ["tokens"],
    summary,
    description: `vLLM's route, served by one of the model's replicas (\`acs.v1.CompletionsService/${type}\` on Connect). The key, the body's decoding and the model's checks are a completion's, with the same envelopes; nothing is charged.`,
    requestBody: {
      required: true,
      content: {
        "application/json": {
          schema: ref(`${type}Request`),
          examples: { [name]: { summary, value: example } },
        },
      },
    },
    responses: {
      "200": {
        description: `vLLM's ${type}Response.`,
        headers: requestIdHeader,
        content: { "application/json": { schema: ref(`${type}Response`) } },
      },
      ...errorsOf(400, 401, 403, 404, 413, 415, 500, 502, 503, 504),
    },
  };
}

/** A malformed URL (`/v1/models/%zz`) is 400 on any route. */
const modelsErrors = errorsOf(400, 401, 500, 503);

const paths: Record<string, Record<string, OpenApiOperation>> = {
  "/v1/completions": { post: completionsOperation },
  "/v1/models": {
    get: {
      operationId: "listModels",
      tags: ["models"],
      summary: "List the models: one entry per id and per alias",
      responses: {
        "200": {
          description: "The models.",
          headers: requestIdHeader,
          content: { "application/json": { schema: ref("ModelList") } },
        },
        ...modelsErrors,
      },
    },
  },
  "/v1/models/{model}": {
    get: {
      operationId: "retrieveModel",
      tags: ["models"],
      summary: "One model, by id or alias",
      parameters: [
        {
          name: "model",
          in: "path",
          required: true,
          description: "A model id or alias; a `/` in it URL-encoded (`%2F`) or not.",
          schema: { type: "string" },
        },
      ],
      responses: {
        "200": {
          description: "The model, named as asked.",
          headers: requestIdHeader,
          content: { "application/json": { schema: ref("Model") } },
        },
        ...modelsErrors,
        "404": errorResponseRef(404),
      },
    },
  },
  "/v1/chat/completions": {
    post: {
      operationId: "createChatCompletion",
      tags: ["completions"],
      summary: "Not served: base models have no chat format (always 400)",
      deprecated: true,
      security: [],
      description:
        "Always 400 `invalid_request`, whatever the body (proto/API.md §8): send `POST /v1/completions` with a prompt.",
      responses: errorsOf(400, 413),
    },
  },
  "/tokenize": {
    post: tokensOperation("tokenize", "A text's token ids (vLLM's /tokenize)", {
      model: "llama-8b",
      prompt: "The sky is",
    }),
  },
  "/detokenize": {
    post: tokensOperation("detokenize", "The text of token ids (vLLM's /detokenize)", {
      model: "llama-8b",
      tokens: [128000, 791, 13180, 374],
    }),
  },
  "/health": {
    get: {
      operationId: "health",
      tags: ["ops"],
      summary: "vLLM's health probe: /readyz's status, with an empty body",
      security: [],
      responses: {
        "200": { description: "Ready: the gateway is serving and a model has a replica up." },
        "503": { description: "Not ready (starting, draining, or no model serves)." },
      },
    },
  },
  "/version": {
    get: {
      operationId: "version",
      tags: ["ops"],
      summary: "vLLM's version route: the gateway's version",
      security: [],
      responses: {
        "200": {
          description: "The gateway's version (its package.json), in vLLM's shape.",
          content: {
            "application/json": {
              schema: {
                type: "object",
                required: ["version"],
                additionalProperties: false,
                properties: { version: { type: "string" } },
              },
            },
          },
        },
      },
    },
  },
  "/healthz": {
    get: {
      operationId: "healthz",
      tags: ["ops"],
      summary: "Liveness: the process answers",
      security: [],
      responses: {
        "200": {
          description: "Alive.",
          content: {
            "application/json": {
              schema: {
                type: "object",
                required: ["status"],
                additionalProperties: false,
                properties: { status: { const: "ok" } },
              },
            },
          },
        },
      },
    },
  },
  "/readyz": {
    get: {
      operationId: "readyz",
      tags: ["ops"],
      summary: "Readiness: a model serves (one of its replicas is up)",
      security: [],
      responses: {
        "200": { description: "Ready.", content: { "application/json": { schema: ref("Readiness") } } },
        "503": { description: "Not ready.", content: { "application/json": { schema: ref("Readiness") } } },
      },
    },
  },
  "/metrics": {
    get: {
      operationId: "metrics",
      tags: ["ops"],
      summary: "Prometheus metrics",
      security: [],
      responses: {
        "200": {
          description: "Prometheus text exposition format.",
          content: { "text/plain": { schema: { type: "string" } } },
        },
      },
    },
  },
  "/openapi.json": {
    get: {
      operationId: "openapi",
      tags: ["ops"],
      summary: "This document",
      security: [],
      responses: {
        "200": {
          description: "The OpenAPI 3.1 document of the REST surface.",
          headers: requestIdHeader,
          content: {
            "application/json": {
              schema: {
                type: "object",
                required: ["openapi", "info", "paths"],
                properties: {
                  openapi: { type: "string" },
                  info: { type: "object" },
                  paths: { type: "object" },
                },
              },
            },
          },
        },
      },
    },
  },
  "/docs": {
    get: {
      operationId: "docs",
      tags: ["ops"],
      summary: "The API reference: this document rendered (Swagger UI, served by the gateway itself)",
      security: [],
      responses: {
        "200": {
          description: "An HTML page.",
          headers: requestIdHeader,
          content: { "text/html": { schema: { type: "string" } } },
        },
      },
    },
  },
};

schemas.Readiness = {
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
};

/** The document (see the module comment). Frozen: it is served as is. */
export const openApiDocument: OpenApiDocument = {
  openapi: "3.1.1",
  jsonSchemaDialect: "https://spec.openapis.org/oas/3.1/dialect/base",
  info: {
    title: "acs-gateway REST API",
    version: "1",
    summary: "OpenAI-compatible completions for base models, with vllm-lens activations and steering.",
    description:
      "The REST surface of the gateway (proto/API.md in the repository is the contract). The same service is served over Connect, gRPC and gRPC-Web as `acs.v1.CompletionsService` on the same port; this document covers REST only. Every response carries `X-Request-Id`; every refusal is the error envelope.",
  },
  servers: [{ url: "/", description: "This gateway" }],
  security: [{ bearerKey: [] }],
  tags: [
    { name: "completions", description: "Completions (OpenAI's `client.completions.create`)." },
    { name: "models", description: "Served models and their facts." },
    { name: "tokens", description: "vLLM's tokenizer routes, answered by the model's Inference." },
    { name: "ops", description: "Health, metrics and this document; no key needed." },
  ],
  paths,
  components: {
    securitySchemes: {
      bearerKey: {
        type: "http",
        scheme: "bearer",
        description:
          "`Authorization: Bearer <key>`: an API key with a Budget in tokens (proto/API.md §9). A gateway run without a key store accepts any key or none.",
      },
    },
    headers: {
      "X-Request-Id": {
        description: "The request's id; the same as the error envelope's `request_id`.",
        required: true,
        schema: { type: "string", pattern: "^req_[0-9a-f]{32}$" },
      },
      "X-Acs-Max-Tokens-Clamped": {
        description: "Near the end of a Budget: the lowered max_tokens (proto/API.md §3).",
        schema: { type: "string", pattern: "^[0-9]+$" },
      },
      "x-should-retry": {
        description:
          "`false` when the Budget is spent (the OpenAI SDKs then do not retry); `true` with Retry-After.",
        schema: { enum: ["true", "false"] },
      },
      "Retry-After": {
        description: "Seconds to wait when only Holds of requests in flight block the request.",
        schema: { type: "string", pattern: "^[0-9]+$" },
      },
      Allow: { description: "The methods the route takes.", schema: { type: "string" } },
    },
    responses: Object.fromEntries(errorStatuses.map((status) => [`Error${status}`, errorResponse(status)])),
    schemas,
  },
};
