import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import { Dtype, type Tensor } from "../../../gen/acs/v1/lens_pb.js";
import { ApiError } from "../../../src/core/errors/index.js";
import { decodeCompletionRequest } from "../../../src/surfaces/rest/decode-completion-request.js";

// Steering vectors are read by the real lens codec (src/lens, tested on its own there).
/** The little-endian float32 bytes of `values`, as a tensor holds them. */
const float32Bytes = (values: number[]) => new Uint8Array(Float32Array.from(values).buffer);

const base = { model: "llama-8b", prompt: "The sky is" };
const body = (fields: Record<string, unknown>): string => JSON.stringify({ ...base, ...fields });

function decodeError(text: string | Uint8Array): ApiError {
  try {
    decodeCompletionRequest(text);
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error(`decoded without an error: ${text}`);
}

const integerFields = ["max_tokens", "n", "logprobs", "top_k", "min_tokens", "prompt_logprobs", "seed"];
const decimalFields = [
  "temperature",
  "top_p",
  "presence_penalty",
  "frequency_penalty",
  "min_p",
  "repetition_penalty",
];
const booleanFields = [
  "stream",
  "echo",
  "ignore_eos",
  "include_stop_str_in_output",
  "skip_special_tokens",
  "spaces_between_special_tokens",
  "add_special_tokens",
  "return_token_ids",
];
const stringFields = ["model", "user"];

interface ErrorCase {
  name: string;
  body: string;
  param: string | null;
  message: string;
}

const typeMessage = (param: string, expected: string) => `Invalid type for '${param}': expected ${expected}.`;

const wrongTypeCases: ErrorCase[] = [
  ...integerFields.flatMap((f) => [
    { name: `${f} "2"`, body: body({ [f]: "2" }), param: f, message: typeMessage(f, "a number") },
    { name: `${f} true`, body: body({ [f]: true }), param: f, message: typeMessage(f, "a number") },
    { name: `${f} [1]`, body: body({ [f]: [1] }), param: f, message: typeMessage(f, "a number") },
    { name: `${f} {}`, body: body({ [f]: {} }), param: f, message: typeMessage(f, "a number") },
    { name: `${f} 1.5`, body: body({ [f]: 1.5 }), param: f, message: typeMessage(f, "an integer") },
    { name: `${f} 1e-1`, body: `{"${f}": 1e-1}`, param: f, message: typeMessage(f, "an integer") },
  ]),
  ...decimalFields.flatMap((f) => [
    { name: `${f} "0.5"`, body: body({ [f]: "0.5" }), param: f, message: typeMessage(f, "a number") },
    { name: `${f} false`, body: body({ [f]: false }), param: f, message: typeMessage(f, "a number") },
    { name: `${f} [0.5]`, body: body({ [f]: [0.5] }), param: f, message: typeMessage(f, "a number") },
  ]),
  ...booleanFields.flatMap((f) => [
    { name: `${f} 1`, body: body({ [f]: 1 }), param: f, message: typeMessage(f, "a boolean") },
    { name: `${f} "true"`, body: body({ [f]: "true" }), param: f, message: typeMessage(f, "a boolean") },
    { name: `${f} 0`, body: body({ [f]: 0 }), param: f, message: typeMessage(f, "a boolean") },
  ]),
  ...stringFields.flatMap((f) => [
    { name: `${f} 1`, body: body({ [f]: 1 }), param: f, message: typeMessage(f, "a string") },
    { name: `${f} ["a"]`, body: body({ [f]: ["a"] }), param: f, message: typeMessage(f, "a string") },
  ]),
  ...[5, true, { text: "a" }, [1, "a"], [[1], "a"], [[1, 1.5]], [1.5], [["a"]], [null]].map((prompt) => ({
    name: `prompt ${JSON.stringify(prompt)}`,
    body: body({ prompt }),
    param: "prompt",
    message: typeMessage(
      "prompt",
      "a string, an array of strings, an array of integers, or an array of arrays of integers",
    ),
  })),
  ...[5, true, ["a", 1], { a: "b" }, [null]].map((stop) => ({
    name: `stop ${JSON.stringify(stop)}`,
    body: body({ stop }),
    param: "stop",
    message: typeMessage("stop", "a string or an array of strings"),
  })),
  ...[5, "1", [1.5], ["1"], [null], {}].map((ids) => ({
    name: `stop_token_ids ${JSON.stringify(ids)}`,
    body: body({ stop_token_ids: ids }),
    param: "stop_token_ids",
    message: typeMessage("stop_token_ids", "an array of integers"),
  })),
  // bad_words in Connect JSON's words (src/surfaces/rpc/explain-proto-json.ts): the item is named.
  ...[5, "it", {}, true].map((words) => ({
    name: `bad_words ${JSON.stringify(words)}`,
    body: body({ bad_words: words }),
    param: "bad_words",
    message: typeMessage("bad_words", "an array"),
  })),
  ...[["a", 1], ["a", "b", ["c"]], [{}]].map((words) => ({
    name: `bad_words ${JSON.stringify(words)}`,
    body: body({ bad_words: words }),
    param: `bad_words[${words.length - 1}]`,
    message: typeMessage(`bad_words[${words.length - 1}]`, "a string"),
  })),
  {
    name: "bad_words [null]",
    body: body({ bad_words: ["a", null] }),
    param: "bad_words[1]",
    message: "Invalid value for 'bad_words[1]': a list item cannot be null.",
  },
  ...[false, 1, "true", [1.5], ["1"], {}].map((value) => ({
    name: `output_residual_stream ${JSON.stringify(value)}`,
    body: body({ output_residual_stream: value }),
    param: "output_residual_stream",
    message: typeMessage("output_residual_stream", "an array of integers or true"),
  })),
  ...[true, "abc", [2], {}].map((value) => ({
    name: `priority ${JSON.stringify(value)}`,
    body: body({ priority: value }),
    param: "priority",
    message: typeMessage("priority", "a number"),
  })),
  ...[2.5, "2.5", "1e3"].map((value) => ({
    name: `priority ${JSON.stringify(value)}`,
    body: body({ priority: value }),
    param: "priority",
    message: typeMessage("priority", "an integer"),
  })),
  {
    name: "stream_options not an object",
    body: body({ stream: true, stream_options: true }),
    param: "stream_options",
    message: typeMessage("stream_options", "an object"),
  },
  {
    name: "stream_options as an array",
    body: body({ stream: true, stream_options: [] }),
    param: "stream_options",
    message: typeMessage("stream_options", "an object"),
  },
  {
    name: "stream_options.include_usage 1",
    body: body({ stream: true, stream_options: { include_usage: 1 } }),
    param: "stream_options.include_usage",
    message: typeMessage("stream_options.include_usage", "a boolean"),
  },
  {
    name: "stream_options.continuous_usage_stats 'yes'",
    body: body({ stream: true, stream_options: { continuous_usage_stats: "yes" } }),
    param: "stream_options.continuous_usage_stats",
    message: typeMessage("stream_options.continuous_usage_stats", "a boolean"),
  },
  {
    name: "apply_steering_vectors not an array",
    body: body({ apply_steering_vectors: {} }),
    param: "apply_steering_vectors",
    message: typeMessage("apply_steering_vectors", "an array"),
  },
  {
    name: "apply_steering_vectors[1] not an object",
    body: body({ apply_steering_vectors: [{}, 3] }),
    param: "apply_steering_vectors[1]",
    message: typeMessage("apply_steering_vectors[1]", "an object"),
  },
  {
    name: "apply_steering_vectors[0] null (null is only 'left out' for a field)",
    body: body({ apply_steering_vectors: [null] }),
    param: "apply_steering_vectors[0]",
    message: typeMessage("apply_steering_vectors[0]", "an object"),
  },
  {
    name: "apply_steering_vectors[0].scale '1'",
    body: body({ apply_steering_vectors: [{ scale: "1" }] }),
    param: "apply_steering_vectors[0].scale",
    message: typeMessage("apply_steering_vectors[0].scale", "a number"),
  },
  {
    name: "apply_steering_vectors[0].norm_match 1",
    body: body({ apply_steering_vectors: [{ norm_match: 1 }] }),
    param: "apply_steering_vectors[0].norm_match",
    message: typeMessage("apply_steering_vectors[0].norm_match", "a boolean"),
  },
  {
    name: "apply_steering_vectors[0].layer_indices [0.5]",
    body: body({ apply_steering_vectors: [{ layer_indices: [0.5] }] }),
    param: "apply_steering_vectors[0].layer_indices",
    message: typeMessage("apply_steering_vectors[0].layer_indices", "an array of integers"),
  },
  {
    name: "apply_steering_vectors[2].position_indices '0'",
    body: body({ apply_steering_vectors: [{}, {}, { position_indices: "0" }] }),
    param: "apply_steering_vectors[2].position_indices",
    message: typeMessage("apply_steering_vectors[2].position_indices", "an array of integers"),
  },
];

const unknownFieldCases: ErrorCase[] = [
  "best_of",
  "suffix",
  "logit_bias",
  "apply_hooks",
  "messages",
  "__proto__",
  "constructor",
  "prototype",
  "toString",
  "hasOwnProperty",
  "Model",
  "max-tokens",
  "",
].map((field) => ({
  name: `unknown field ${JSON.stringify(field)}`,
  body: `{"model":"llama-8b","prompt":"x",${JSON.stringify(field)}: 1}`,
  param: field,
  message: `Unrecognized request argument supplied: ${field}`,
}));

const nestedUnknownCases: ErrorCase[] = [
  {
    name: "stream_options.foo",
    body: body({ stream: true, stream_options: { include_usage: true, foo: 1 } }),
    param: "stream_options.foo",
    message: "Unrecognized request argument supplied: stream_options.foo",
  },
  {
    name: "stream_options.__proto__",
    body: '{"stream_options": {"__proto__": {"include_usage": true}}}',
    param: "stream_options.__proto__",
    message: "Unrecognized request argument supplied: stream_options.__proto__",
  },
  {
    name: "apply_steering_vectors[0].coeff",
    body: body({ apply_steering_vectors: [{ scale: 1, coeff: 2 }] }),
    param: "apply_steering_vectors[0].coeff",
    message: "Unrecognized request argument supplied: apply_steering_vectors[0].coeff",
  },
  {
    name: "apply_steering_vectors[0].activations.device",
    body: body({
      apply_steering_vectors: [
        { activations: { data: "AAAAAA==", dtype: "float32", shape: [1, 1], device: "cuda" } },
      ],
    }),
    param: "apply_steering_vectors[0].activations.device",
    message: "Unrecognized request argument supplied: apply_steering_vectors[0].activations.device",
  },
  {
    name: "apply_steering_vectors[0].activations.__proto__",
    body: '{"apply_steering_vectors": [{"activations": {"__proto__": {"polluted": true}}}]}',
    param: "apply_steering_vectors[0].activations.__proto__",
    message: "Unrecognized request argument supplied: apply_steering_vectors[0].activations.__proto__",
  },
];

const rangeMessage32 = (f: string) =>
  `Invalid value for '${f}': expected an integer from -2147483648 to 2147483647 (int32).`;
const rangeMessage64 = (f: string) =>
  `Invalid value for '${f}': expected an integer from -9223372036854775808 to 9223372036854775807 (int64).`;

const rangeCases: ErrorCase[] = [
  ...integerFields
    .filter((f) => f !== "seed")
    .flatMap((f) => [
      { name: `${f} 2^31`, body: `{"${f}": 2147483648}`, param: f, message: rangeMessage32(f) },
      { name: `${f} -2^31-1`, body: `{"${f}": -2147483649}`, param: f, message: rangeMessage32(f) },
      { name: `${f} 1e400`, body: `{"${f}": 1e400}`, param: f, message: rangeMessage32(f) },
    ]),
  {
    name: "seed 2^63",
    body: '{"seed": 9223372036854775808}',
    param: "seed",
    message: rangeMessage64("seed"),
  },
  {
    name: "seed -2^63-1",
    body: '{"seed": -9223372036854775809}',
    param: "seed",
    message: rangeMessage64("seed"),
  },
  { name: "seed 1e19", body: '{"seed": 1e19}', param: "seed", message: rangeMessage64("seed") },
  {
    name: "seed with a huge exponent",
    body: '{"seed": 1e999999999999}',
    param: "seed",
    message: rangeMessage64("seed"),
  },
  {
    name: 'priority "2147483648"',
    body: '{"priority": "2147483648"}',
    param: "priority",
    message: rangeMessage32("priority"),
  },
  {
    name: "priority as a long digit string",
    body: `{"priority": "${"9".repeat(5000)}"}`,
    param: "priority",
    message: rangeMessage32("priority"),
  },
  {
    name: "prompt token id 2^31",
    body: body({ prompt: [2147483648] }),
    param: "prompt",
    message: rangeMessage32("prompt"),
  },
  {
    name: "stop_token_ids item 2^31",
    body: body({ stop_token_ids: [2147483648] }),
    param: "stop_token_ids",
    message: rangeMessage32("stop_token_ids"),
  },
  ...decimalFields.map((f) => ({
    name: `${f} 1e400`,
    body: `{"${f}": 1e400}`,
    param: f,
    message: `Invalid value for '${f}': the number is too large.`,
  })),
];

const bodyCases: ErrorCase[] = [
  { name: "empty body", body: "", param: null, message: "The request body is empty: send a JSON object." },
  {
    name: "whitespace body",
    body: "  \n",
    param: null,
    message: "The request body is empty: send a JSON object.",
  },
  ...["[]", "1", '"x"', "null", "true"].map((text) => ({
    name: `top level ${text}`,
    body: text,
    param: null,
    message: "The request body must be a JSON object.",
  })),
];

describe("decodeCompletionRequest refusals", () => {
  it.each([...wrongTypeCases, ...unknownFieldCases, ...nestedUnknownCases, ...rangeCases, ...bodyCases])(
    "$name",
    ({ body: text, param, message }) => {
      const err = decodeError(text);
      expect({ status: err.status, code: err.code, param: err.param, message: err.message }).toEqual({
        status: 400,
        code: "invalid_request",
        param,
        message,
      });
    },
  );

  it.each([
    "{",
    '{"model": }',
    "{'model': 'x'}",
    '{"model": "x",}',
    '{"a": 1} {"b": 2}',
    '{"n": 01}',
    '{"n": NaN}',
    '{"a": 1, "a": 2}',
    "[".repeat(100_000),
  ])("malformed JSON %#: 400 with param null and a message naming the problem", (text) => {
    const err = decodeError(text);
    expect([err.status, err.code, err.param]).toEqual([400, "invalid_request", null]);
    expect(err.message).toMatch(/^The request body is not valid JSON: .+\.$/);
  });

  it("echoes at most 200 characters of a caller's key (unknown field, duplicate key)", () => {
    const key = "k".repeat(10_000);
    const unknown = decodeError(`{"${key}": 1}`);
    expect([unknown.param, unknown.message]).toEqual([
      `${"k".repeat(200)}…`,
      `Unrecognized request argument supplied: ${"k".repeat(200)}…`,
    ]);
    const duplicate = decodeError(`{"${key}": 1, "${key}": 2}`);
    expect(duplicate.message.length).toBeLessThan(300);
  });

  it("checks unknown fields before any type", () => {
    const err = decodeError('{"max_tokens": "2", "best_of": 2}');
    expect(err.param).toBe("best_of");
  });

  it("checks the types of fields in body order", () => {
    expect(decodeError('{"n": "1", "max_tokens": "2"}').param).toBe("n");
    expect(decodeError('{"max_tokens": "2", "n": "1"}').param).toBe("max_tokens");
  });

  it("passes the lens codec's ApiError through with its param", () => {
    const err = decodeError(body({ apply_steering_vectors: [{}, { activations: "bad" }] }));
    expect([err.code, err.param, err.message]).toEqual([
      "invalid_request",
      "apply_steering_vectors[1].activations",
      "Invalid type for 'apply_steering_vectors[1].activations': expected an array of arrays of numbers or a tensor object.",
    ]);
  });

  it("never changes a prototype through __proto__ (the key is refused, Object.prototype untouched)", () => {
    const err = decodeError('{"__proto__": {"polluted": true}, "model": "x"}');
    expect(err.param).toBe("__proto__");
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});

interface DecodeCase {
  name: string;
  body: string;
  stream?: boolean;
  request: Parameters<typeof create<typeof CreateCompletionRequestSchema>>[1];
}

const decodeCases: DecodeCase[] = [
  {
    name: "model and prompt only",
    body: body({}),
    request: { model: "llama-8b", prompt: { case: "text", value: "The sky is" } },
  },
  {
    name: "null leaves every field out",
    body: body(
      Object.fromEntries(
        [...integerFields, ...decimalFields, ...booleanFields, "user", "stop", "stream_options", "priority"]
          .concat(["stop_token_ids", "output_residual_stream", "apply_steering_vectors", "bad_words"])
          .map((f) => [f, null]),
      ),
    ),
    stream: false,
    request: { model: "llama-8b", prompt: { case: "text", value: "The sky is" } },
  },
  {
    name: "zero and false stay set (presence)",
    body: body({ temperature: 0, echo: false, n: 0, presence_penalty: 0, top_k: 0, ignore_eos: false }),
    request: {
      ...{ model: "llama-8b", prompt: { case: "text", value: "The sky is" } },
      temperature: 0,
      echo: false,
      n: 0,
      presencePenalty: 0,
      topK: 0,
      ignoreEos: false,
    },
  },
  {
    name: "integers written as 1.0, 1e2, -0; whole numbers for decimals",
    body: '{"max_tokens": 1.0, "n": 1e0, "logprobs": 2.00, "top_k": -1, "min_tokens": -0, "prompt_logprobs": 0.5e1, "temperature": 1, "top_p": 1E0}',
    request: {
      maxTokens: 1,
      n: 1,
      logprobs: 2,
      topK: -1,
      minTokens: 0,
      promptLogprobs: 5,
      temperature: 1,
      topP: 1,
    },
  },
  {
    name: "int32 bounds",
    body: '{"max_tokens": 2147483647, "top_k": -2147483648, "priority": -2147483648}',
    request: { maxTokens: 2147483647, topK: -2147483648, priority: -2147483648 },
  },
  {
    name: "seed: int64 bounds, exact",
    body: '{"seed": 9223372036854775807}',
    request: { seed: 9223372036854775807n },
  },
  { name: "seed: -2^63", body: '{"seed": -9223372036854775808}', request: { seed: -9223372036854775808n } },
  {
    name: "seed: 2^53 + 1 (not a double)",
    body: '{"seed": 9007199254740993}',
    request: { seed: 9007199254740993n },
  },
  { name: "seed: 1.5e3 is the integer 1500", body: '{"seed": 1.5e3}', request: { seed: 1500n } },
  { name: "priority as a string", body: '{"priority": "2"}', request: { priority: 2 } },
  { name: "priority as a negative string", body: '{"priority": "-3"}', request: { priority: -3 } },
  {
    name: "priority as a string with 100,000 leading zeros",
    body: `{"priority": "-${"0".repeat(100_000)}5"}`,
    request: { priority: -5 },
  },
  { name: "priority as a number", body: '{"priority": 7}', request: { priority: 7 } },
  {
    name: "decimals keep their value",
    body: '{"temperature": 0.7, "top_p": 0.95, "min_p": 1e-3, "repetition_penalty": 1.1, "presence_penalty": -2, "frequency_penalty": 2}',
    request: {
      temperature: 0.7,
      topP: 0.95,
      minP: 0.001,
      repetitionPenalty: 1.1,
      presencePenalty: -2,
      frequencyPenalty: 2,
    },
  },
  {
    name: "every boolean field",
    body: JSON.stringify(
      Object.fromEntries(booleanFields.filter((f) => f !== "stream").map((f) => [f, true])),
    ),
    request: {
      echo: true,
      ignoreEos: true,
      includeStopStrInOutput: true,
      skipSpecialTokens: true,
      spacesBetweenSpecialTokens: true,
      addSpecialTokens: true,
      returnTokenIds: true,
    },
  },
  {
    name: "prompt: strings",
    body: '{"prompt": ["a", "b"]}',
    request: { prompt: { case: "texts", value: { values: ["a", "b"] } } },
  },
  {
    name: "prompt: empty array → texts (the service refuses it)",
    body: '{"prompt": []}',
    request: { prompt: { case: "texts", value: { values: [] } } },
  },
  {
    name: "prompt: empty string stays (the service refuses it)",
    body: '{"prompt": ""}',
    request: { prompt: { case: "text", value: "" } },
  },
  {
    name: "prompt: token ids",
    body: '{"prompt": [1, 2.0, 3]}',
    request: { prompt: { case: "tokenIds", value: { values: [1, 2, 3] } } },
  },
  {
    name: "prompt: negative token id is a type-valid integer (range is the service's)",
    body: '{"prompt": [-1]}',
    request: { prompt: { case: "tokenIds", value: { values: [-1] } } },
  },
  {
    name: "prompt: lists of token ids",
    body: '{"prompt": [[1, 2], [3], []]}',
    request: {
      prompt: {
        case: "tokenIdsList",
        value: { values: [{ values: [1, 2] }, { values: [3] }, { values: [] }] },
      },
    },
  },
  { name: "stop: one string", body: '{"stop": "\\n"}', request: { stop: ["\n"] } },
  { name: "stop: strings", body: '{"stop": ["a", "b"]}', request: { stop: ["a", "b"] } },
  { name: "stop_token_ids", body: '{"stop_token_ids": [128001, 0]}', request: { stopTokenIds: [128001, 0] } },
  {
    name: "bad_words (as given: ranges are the service's)",
    body: '{"bad_words": ["it", " the", "", "ü"]}',
    request: { badWords: ["it", " the", "", "ü"] },
  },
  { name: "bad_words []", body: '{"bad_words": []}', request: {} },
  { name: "stream true", body: '{"stream": true}', stream: true, request: {} },
  { name: "stream false", body: '{"stream": false}', stream: false, request: {} },
  {
    name: "stream_options (kept even without stream: the service refuses that)",
    body: '{"stream_options": {"include_usage": true, "continuous_usage_stats": false}}',
    stream: false,
    request: { streamOptions: { includeUsage: true, continuousUsageStats: false } },
  },
  { name: "stream_options {}", body: '{"stream_options": {}}', request: { streamOptions: {} } },
  {
    name: "stream_options with null keys",
    body: '{"stream_options": {"include_usage": null}}',
    request: { streamOptions: {} },
  },
  {
    name: "output_residual_stream true",
    body: '{"output_residual_stream": true}',
    request: { outputResidualStream: { allLayers: true } },
  },
  { name: "output_residual_stream null = left out", body: '{"output_residual_stream": null}', request: {} },
  {
    name: "output_residual_stream layers",
    body: '{"output_residual_stream": [15, 20]}',
    request: { outputResidualStream: { layerIndices: [15, 20] } },
  },
  { name: "user", body: '{"user": "u-1"}', request: { user: "u-1" } },
  {
    name: "apply_steering_vectors",
    body: JSON.stringify({
      apply_steering_vectors: [
        { activations: [[0.5, 1]], layer_indices: [3], scale: 2, norm_match: true, position_indices: null },
        { activations: null, position_indices: [0, 1] },
      ],
    }),
    request: {
      applySteeringVectors: [
        {
          activations: { dtype: Dtype.FLOAT32, shape: [1, 2], data: float32Bytes([0.5, 1]) },
          layerIndices: [3],
          scale: 2,
          normMatch: true,
        },
        { positionIndices: [0, 1] },
      ],
    },
  },
];

describe("decodeCompletionRequest on raw bytes", () => {
  const bytes = (...parts: (string | number[])[]): Uint8Array =>
    Buffer.concat(parts.map((p) => (typeof p === "string" ? Buffer.from(p) : Buffer.from(p))));

  it.each([
    {
      name: "\\xff\\xfe inside a string",
      body: bytes('{"model": "llama-8b", "prompt": "a', [0xff, 0xfe], '"}'),
    },
    { name: "a lone continuation byte", body: bytes('{"prompt": "', [0x80], '"}') },
    { name: "a truncated 3-byte sequence", body: bytes('{"prompt": "', [0xe2, 0x82], '"}') },
    { name: "an overlong encoding", body: bytes('{"prompt": "', [0xc0, 0xaf], '"}') },
    { name: "a UTF-16 surrogate as UTF-8", body: bytes('{"prompt": "', [0xed, 0xa0, 0x80], '"}') },
    { name: "invalid bytes outside strings", body: bytes("{", [0xff], "}") },
  ])("refuses invalid UTF-8 ($name): 400, param null, never U+FFFD", ({ body: raw }) => {
    const err = decodeError(raw);
    expect([err.status, err.code, err.param]).toEqual([400, "invalid_request", null]);
    expect(err.message).toMatch(/UTF-8/);
  });

  it("refuses a leading BOM (never stripped)", () => {
    const err = decodeError(bytes([0xef, 0xbb, 0xbf], body({})));
    expect([err.status, err.code, err.param]).toEqual([400, "invalid_request", null]);
  });

  it("decodes valid UTF-8, multi-byte characters included", () => {
    const decoded = decodeCompletionRequest(bytes(JSON.stringify({ prompt: "é → 😀", user: "ü" })));
    expect([decoded.request.prompt, decoded.request.user]).toEqual([{ case: "text", value: "é → 😀" }, "ü"]);
  });
});

describe("decodeCompletionRequest decodes", () => {
  it.each(decodeCases)("$name", ({ body: text, stream, request }) => {
    const decoded = decodeCompletionRequest(text);
    expect(decoded.request).toEqual(create(CreateCompletionRequestSchema, request));
    expect(decoded.stream).toBe(stream ?? false);
  });

  it("reads a steering vector's tensor dict and its nested lists of JSON numbers as tensors", () => {
    const activations = { data: "AACAPw==", dtype: "float32", shape: [1, 1], compression: null };
    const decoded = decodeCompletionRequest(
      body({ apply_steering_vectors: [{}, { activations }, { activations: [[1, 2.5]] }] }),
    );
    // Bytes compared as lists (the dict's are a Buffer, a Uint8Array subclass).
    const plain = (t: Tensor | undefined) => t && { dtype: t.dtype, shape: t.shape, data: [...t.data] };
    expect(decoded.request.applySteeringVectors.map((v) => plain(v.activations))).toEqual([
      undefined,
      { dtype: Dtype.FLOAT32, shape: [1, 1], data: [...float32Bytes([1])] },
      { dtype: Dtype.FLOAT32, shape: [1, 2], data: [...float32Bytes([1, 2.5])] },
    ]);
  });
});
