// Connect JSON refused by connect-es is explained in the REST decoder's words: for every scalar
// field the two surfaces share, a wrong value gets the same message and param on both.
import { ScalarType } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../../src/core/errors/index.js";
import {
  completionRequestFieldNames,
  decodeCompletionRequest,
} from "../../../src/surfaces/rest/decode-completion-request.js";
import { explainProtoJson } from "../../../src/surfaces/rpc/explain-proto-json.js";

const encode = (text: string) => new TextEncoder().encode(text);

function restRefusal(body: string): ApiError {
  try {
    decodeCompletionRequest(encode(body));
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error(`REST took ${body}`);
}

function connectRefusal(body: string): ApiError {
  const err = explainProtoJson(CreateCompletionRequestSchema, encode(body));
  if (err === undefined) throw new Error(`no fault found in ${body}`);
  return err;
}

const integer = [ScalarType.INT32, ScalarType.INT64, ScalarType.UINT32, ScalarType.UINT64];
const badValues = (scalar: ScalarType): string[] => {
  if (integer.includes(scalar)) return ["true", '"abc"', "[]", "{}", "1.5", "1e30"];
  if (scalar === ScalarType.DOUBLE) return ["true", '"abc"', "[]", "{}", "1e400"];
  if (scalar === ScalarType.BOOL) return ["1", '"true"', "[]", "{}"];
  return ["1", "true", "[]", "{}"];
};

// The scalar fields REST and Connect share (priority aside: REST also takes "2" there).
const shared = CreateCompletionRequestSchema.fields.filter(
  (f) =>
    f.fieldKind === "scalar" &&
    f.oneof === undefined &&
    f.name !== "priority" &&
    completionRequestFieldNames.includes(f.name),
);

describe("the same words as REST", () => {
  it("covers the shared scalar fields", () => {
    expect(shared.map((f) => f.name)).toEqual(
      expect.arrayContaining(["max_tokens", "temperature", "seed", "echo", "user", "top_k", "min_tokens"]),
    );
  });

  const rows = shared.flatMap((f) =>
    badValues(f.scalar ?? ScalarType.STRING).map((v) => [f.name, v] as const),
  );
  it.each(rows)("%s: %s", (name, value) => {
    const model = name === "model" ? "" : '"model":"tiny",';
    const rest = restRefusal(`{${model}"prompt":"Hi","${name}":${value}}`);
    const connect = connectRefusal(`{${model}"text":"Hi","${name}":${value}}`);
    expect({ message: connect.message, param: connect.param, code: connect.code }).toEqual({
      message: rest.message,
      param: rest.param,
      code: rest.code,
    });
  });

  it.each([
    [
      "an unknown field",
      '{"model":"tiny","prompt":"Hi","logit_bias":{}}',
      '{"model":"tiny","text":"Hi","logit_bias":{}}',
    ],
    ["malformed JSON", '{"model":"tiny",', '{"model":"tiny",'],
    ["not an object", "[1]", "[1]"],
    [
      "a nested unknown field",
      '{"model":"tiny","prompt":"Hi","stream_options":{"x":1}}',
      '{"model":"tiny","text":"Hi","stream_options":{"x":1}}',
    ],
    ["invalid UTF-8", '{"model":"\xff"}', '{"model":"\xff"}'],
    // A fault inside the prompt oneof is `prompt`, REST's name for all of its members.
    [
      "a token id out of range",
      '{"model":"tiny","prompt":[1,4294967296]}',
      '{"model":"tiny","tokenIds":{"values":[1,4294967296]}}',
    ],
    [
      "a token id out of range in a list of prompts",
      '{"model":"tiny","prompt":[[1],[2,-2147483649]]}',
      '{"model":"tiny","token_ids_list":{"values":[{"values":[1]},{"values":[2,-2147483649]}]}}',
    ],
  ])("%s", (_name, restBody, connectBody) => {
    const bytes = (s: string) => Uint8Array.from(s, (c) => c.charCodeAt(0) & 0xff);
    const rest = (() => {
      try {
        decodeCompletionRequest(bytes(restBody));
      } catch (err) {
        return err as ApiError;
      }
      throw new Error("REST took it");
    })();
    const connect = explainProtoJson(CreateCompletionRequestSchema, bytes(connectBody));
    expect(connect?.message).toBe(rest.message);
    expect(connect?.param).toBe(rest.param);
  });
});

describe("protobuf JSON's own rules", () => {
  it.each([
    // Protobuf JSON takes an int64 in a string (and so does priority, as REST), the JSON names
    // and null.
    '{"model":"tiny","text":"Hi","maxTokens":2,"priority":"-3"}',
    '{"model":"tiny","text":"Hi","seed":"9223372036854775807","n":null}',
    '{"model":"tiny","tokenIds":{"values":[1,2]}}',
  ])("finds no fault in %s", (body) => {
    expect(explainProtoJson(CreateCompletionRequestSchema, encode(body))).toBeUndefined();
  });

  it.each([
    [
      '{"model":"tiny","text":"Hi","texts":{"values":["a"]}}',
      "prompt",
      "Only one of text, texts, token_ids, token_ids_list may be set ('prompt'); got text and texts.",
    ],
    [
      '{"model":"tiny","tokenIds":{"values":[1,null]}}',
      "prompt",
      "Invalid value for 'prompt': a list item cannot be null.",
    ],
    [
      '{"model":"tiny","texts":{"values":["a",1]}}',
      "prompt",
      "Invalid type for 'prompt': expected a string.",
    ],
    ['{"model":"tiny","text":1}', "prompt", "Invalid type for 'prompt': expected a string."],
    [
      '{"model":"tiny","texts":{"valuez":["a"]}}',
      "texts.valuez",
      "Unrecognized request argument supplied: texts.valuez",
    ],
    [
      '{"model":"tiny","text":"Hi","applySteeringVectors":[{"scale":"x"}]}',
      "apply_steering_vectors[0].scale",
      "Invalid type for 'apply_steering_vectors[0].scale': expected a number.",
    ],
    [
      '{"model":"tiny","text":"Hi","applySteeringVectors":[{"activations":{"dtype":"FLOAT64"}}]}',
      "apply_steering_vectors[0].activations.dtype",
      "Invalid value for 'apply_steering_vectors[0].activations.dtype': expected one of DTYPE_UNSPECIFIED, DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_FLOAT32.",
    ],
    [
      '{"model":"tiny","text":"Hi","applySteeringVectors":[{"activations":{"data":"**"}}]}',
      "apply_steering_vectors[0].activations.data",
      "Invalid value for 'apply_steering_vectors[0].activations.data': expected a base64 string.",
    ],
    ['{"model":"tiny","text":"Hi","stop":"x"}', "stop", "Invalid type for 'stop': expected an array."],
    // A number in a string is not a number (proto/API.md §4), but for an int64 and priority.
    [
      '{"model":"tiny","text":"Hi","maxTokens":"2"}',
      "max_tokens",
      "Invalid type for 'max_tokens': expected a number.",
    ],
    [
      '{"model":"tiny","text":"Hi","temperature":"NaN"}',
      "temperature",
      "Invalid type for 'temperature': expected a number.",
    ],
  ])("%s", (body, param, message) => {
    const err = explainProtoJson(CreateCompletionRequestSchema, encode(body));
    expect(err?.param).toBe(param);
    expect(err?.message).toBe(message);
  });
});
