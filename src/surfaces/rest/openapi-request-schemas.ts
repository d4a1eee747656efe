// The request schemas of the OpenAPI document (src/surfaces/rest/openapi.ts), generated from the protos
// (src/surfaces/rest/openapi-from-proto.ts): `POST /v1/completions`, `/tokenize` and `/detokenize`.
//
// This file holds what the descriptors do not carry: the descriptions and defaults that the
// protos' comments give (proto/acs/v1/*.proto). REST's JSON forms beyond proto JSON come from the
// table the decoder reads too (src/surfaces/rest/rest-json-forms.ts).
import {
  CreateCompletionRequestSchema,
  DetokenizeRequestSchema,
  TokenizeRequestSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { SteeringVectorSchema } from "../../../gen/acs/v1/lens_pb.js";
import { type MessageDocs, messageObjectSchema, type ProtoSchemaTable } from "./openapi-from-proto.js";
import { type JsonSchema, orNull } from "./openapi-json-schema.js";
import { openApiForms } from "./rest-json-forms.js";

const completionRequestDocs: MessageDocs = {
  description:
    "The body of `POST /v1/completions` (proto/API.md §2): `acs.v1.CreateCompletionRequest` under its REST JSON names, plus `stream`. `null` means left out, for every field. Unknown fields are refused (400, param = the field). Ranges and cross-field rules are the service's (same as on Connect).",
  fields: {
    model: { description: "A served model id or alias (e.g. `llama-8b`). Unknown → 404 `model_not_found`." },
    prompt: { description: "Non-empty: a string, strings, token ids (integers ≥ 0), or lists of token ids." },
    max_tokens: {
      description:
        "Tokens to generate per choice (proto/API.md §3). Default: what fits the context, at most 32,000 (15,600 without `stream`); required with several prompts or n > 1.",
    },
    n: { default: 1, description: "Choices per prompt; > 1 refused when temperature < 0.00001." },
    temperature: { default: 1 },
    top_p: { default: 1 },
    stop: { description: "At most 4 non-empty strings." },
    stream_options: { description: "Only with `stream: true`." },
    logprobs: { description: "Top candidates per token." },
    echo: { default: false },
    presence_penalty: { default: 0 },
    frequency_penalty: { default: 0 },
    seed: { description: "−2^63 … 2^63−1, kept exact (never rounded through a double)." },
    top_k: { default: 0, description: "−1 or 0 = off (vLLM)." },
    min_p: { default: 0 },
    repetition_penalty: { default: 1 },
    min_tokens: { default: 0, description: "≤ max_tokens." },
    ignore_eos: { default: false },
    include_stop_str_in_output: { default: false },
    skip_special_tokens: { default: true },
    spaces_between_special_tokens: { default: true },
    add_special_tokens: { default: true },
    prompt_logprobs: { description: "Refused with `stream: true`." },
    return_token_ids: {
      default: false,
      description: "Adds `prompt_token_ids` and `token_ids` to each choice.",
    },
    priority: {
      default: 0,
      description: 'Lower is served earlier (vLLM). An integer, or a string holding one (`"2"`).',
    },
    bad_words: {
      description:
        "Words never generated (vLLM): at most 64, each 1–100 characters. Each word is tokenized as written and after a space; the last token of each is forbidden where the tokens before it were just generated.",
    },
    output_residual_stream: {
      description:
        "Capture the residual stream (vllm-lens): layer indices (unique, each in [0, layers)), or `true` for all layers. The answer then carries `activations`.",
    },
  },
};

/** What the protos' comments say, by message. */
const docs: ProtoSchemaTable["docs"] = {
  "acs.v1.CreateCompletionRequest": completionRequestDocs,
  "acs.v1.StreamOptions": {
    fields: {
      include_usage: { description: "A last chunk with `choices: []` and the usage." },
      continuous_usage_stats: {
        description:
          "With include_usage: every chunk carries the usage so far of its choice (vLLM: its prompt's tokens and what it generated so far).",
      },
    },
  },
  "acs.v1.SteeringVector": {
    description: "A vector added to the residual stream (vllm-lens, proto/API.md §6).",
    fields: {
      activations: {
        description:
          "2D (layers, hidden): added at every position; or 3D (layers, positions, hidden). Last dim = the model's hidden_size.",
      },
      layer_indices: { description: "One per row of activations." },
      scale: { default: 1 },
      norm_match: { default: false, description: "Scale the added vector to ‖residual‖ · scale per token." },
      position_indices: { description: "3D only; one per position (default 0…n−1); each < max_model_len." },
    },
  },
  "acs.v1.TokenizeRequest": {
    description:
      "The body of vLLM's `POST /tokenize` (`acs.v1.TokenizeRequest`; vLLM's chat form with `messages` is not served). Decoded as a completion's body: unknown fields refused, `null` means left out.",
    fields: {
      model: { description: "A model id or alias, as in a completion." },
      prompt: { description: "The text (may be empty)." },
      add_special_tokens: { description: "Add BOS, as a completion's prompt gets it. Default true." },
      return_token_strs: { description: "Also return each token's string. Default false." },
    },
  },
  "acs.v1.DetokenizeRequest": {
    description: "The body of vLLM's `POST /detokenize` (`acs.v1.DetokenizeRequest`).",
    fields: {
      model: { description: "A model id or alias, as in a completion." },
      tokens: { description: "Token ids; one outside the vocabulary is refused by Inference (400)." },
    },
  },
};

/** The table of the request messages (see src/surfaces/rest/openapi-from-proto.ts). */
const table: ProtoSchemaTable = {
  components: { "acs.v1.SteeringVector": "SteeringVector" },
  ...openApiForms,
  docs,
};

/** A tensor as vllm-lens writes it (requests' steering vectors, responses' activations). */
const encodedTensor: JsonSchema = {
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
};

/** The component schemas of the request bodies, by name. */
export const requestSchemas: Readonly<Record<string, JsonSchema>> = {
  CompletionRequest: messageObjectSchema(CreateCompletionRequestSchema, table),
  SteeringVector: messageObjectSchema(SteeringVectorSchema, table),
  EncodedTensor: encodedTensor,
  TokenizeRequest: messageObjectSchema(TokenizeRequestSchema, table),
  DetokenizeRequest: messageObjectSchema(DetokenizeRequestSchema, table),
};
