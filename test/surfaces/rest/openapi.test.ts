// The OpenAPI document (src/surfaces/rest/openapi.ts): valid OpenAPI 3.1 by a maintained validator, and in
// step with the protos, the REST decoder, the renderers and the error catalogue. What it serves is
// checked in test/integration/api-docs.test.ts; every REST response of the end-to-end tests is
// validated against it there (test/helpers/openapi-check.ts).
import { create, type DescMessage } from "@bufbuild/protobuf";
import { Validator } from "@seriousme/openapi-schema-validator";
import { describe, expect, it } from "vitest";
import {
  CompletionChoiceSchema,
  CreateCompletionRequestSchema,
  CreateCompletionResponseSchema,
  DetokenizeRequestSchema,
  DetokenizeResponseSchema,
  FinishReason,
  ListModelsResponseSchema,
  ModelSchema,
  StreamCompletionResponseSchema,
  TokenizeRequestSchema,
  TokenizeResponseSchema,
  UsageSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { Dtype, SteeringVectorSchema, TensorSchema } from "../../../gen/acs/v1/lens_pb.js";
import { errorCatalogue } from "../../../src/core/errors/index.js";
import { validateRequest, validateTokensRequest } from "../../../src/service/validate-request.js";
import {
  completionRequestFieldNames,
  decodeCompletionRequest,
} from "../../../src/surfaces/rest/decode-completion-request.js";
import {
  decodeDetokenizeRequest,
  decodeTokenizeRequest,
  detokenizeRequestFieldNames,
  tokenizeRequestFieldNames,
} from "../../../src/surfaces/rest/decode-tokens-request.js";
import {
  errorCodesOfStatus,
  errorStatuses,
  type JsonSchema,
  openApiDocument,
} from "../../../src/surfaces/rest/openapi.js";
import { messageObjectSchema } from "../../../src/surfaces/rest/openapi-from-proto.js";
import {
  renderChunk,
  renderCompletion,
  renderModelList,
} from "../../../src/surfaces/rest/render-completion.js";
import { renderDetokenize, renderTokenize } from "../../../src/surfaces/rest/render-tokens.js";
import { createOpenApiChecker } from "../../helpers/openapi-check.js";

const schemas = openApiDocument.components.schemas;
const propertiesOf = (name: string) =>
  Object.keys((schemas[name]?.properties as Record<string, JsonSchema> | undefined) ?? {}).sort();
/** The REST JSON name of each field of a message: the field's name, or its oneof's. */
const restNamesOf = (message: DescMessage) => [
  ...new Set(message.fields.map((field) => field.oneof?.name ?? field.name)),
];
const sorted = (names: Iterable<string>) => [...names].sort();

describe("the OpenAPI document", () => {
  it("is a valid OpenAPI 3.1 document (@seriousme/openapi-schema-validator)", async () => {
    const validator = new Validator();
    const result = await validator.validate(structuredClone(openApiDocument));
    expect(result.errors ?? []).toStrictEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe("3.1");
  });

  it("compiles under ajv's JSON Schema 2020-12 in strict mode (every schema, every $ref)", () => {
    const checker = createOpenApiChecker();
    for (const name of Object.keys(schemas)) expect(() => checker.validate(name, null)).not.toThrow();
  });

  it("CompletionRequest has every field of acs.v1.CreateCompletionRequest under its REST name, plus stream, and those the decoder takes", () => {
    const fromProto = sorted([...restNamesOf(CreateCompletionRequestSchema), "stream"]);
    expect(propertiesOf("CompletionRequest")).toStrictEqual(fromProto);
    expect(propertiesOf("CompletionRequest")).toStrictEqual(sorted(completionRequestFieldNames));
    expect(schemas.CompletionRequest?.additionalProperties).toBe(false);
  });

  it("the tokenize and detokenize schemas have every field of their proto message, and those the decoder takes", async () => {
    expect(propertiesOf("TokenizeRequest")).toStrictEqual(sorted(restNamesOf(TokenizeRequestSchema)));
    expect(propertiesOf("TokenizeRequest")).toStrictEqual(sorted(tokenizeRequestFieldNames));
    expect(propertiesOf("DetokenizeRequest")).toStrictEqual(sorted(restNamesOf(DetokenizeRequestSchema)));
    expect(propertiesOf("DetokenizeRequest")).toStrictEqual(sorted(detokenizeRequestFieldNames));
    expect(propertiesOf("TokenizeResponse")).toStrictEqual(sorted(restNamesOf(TokenizeResponseSchema)));
    expect(propertiesOf("DetokenizeResponse")).toStrictEqual(sorted(restNamesOf(DetokenizeResponseSchema)));
    const checker = createOpenApiChecker();
    const decoders = { "/tokenize": decodeTokenizeRequest, "/detokenize": decodeDetokenizeRequest };
    for (const [path, decode] of Object.entries(decoders)) {
      const body = openApiDocument.paths[path]?.post?.requestBody as {
        content: Record<string, { schema: { $ref: string }; examples: Record<string, { value: unknown }> }>;
      };
      const media = body.content["application/json"];
      const name = media?.schema.$ref.split("/").at(-1) ?? "";
      for (const { value } of Object.values(media?.examples ?? {})) {
        expect(checker.validate(name, value)).toStrictEqual([]);
        await expect(decode(new TextEncoder().encode(JSON.stringify(value)))).resolves.toBeDefined();
      }
      expect(checker.validate(name, { model: "m", prompt: "p", tokens: [1], extra: 1 })).not.toStrictEqual(
        [],
      );
    }
    const tokens = create(TokenizeResponseSchema, {
      count: 2,
      maxModelLen: 8,
      tokens: [1, 2],
      tokenStrs: ["a", "b"],
    });
    expect(checker.validate("TokenizeResponse", renderTokenize(tokens, true))).toStrictEqual([]);
    expect(checker.validate("TokenizeResponse", renderTokenize(tokens, false))).toStrictEqual([]);
    expect(
      checker.validate(
        "DetokenizeResponse",
        renderDetokenize(create(DetokenizeResponseSchema, { prompt: "ab" })),
      ),
    ).toStrictEqual([]);
  });

  it("SteeringVector, Model and CompletionChoice have every field of their proto message", () => {
    expect(propertiesOf("SteeringVector")).toStrictEqual(sorted(restNamesOf(SteeringVectorSchema)));
    expect(propertiesOf("CompletionChoice")).toStrictEqual(sorted(restNamesOf(CompletionChoiceSchema)));
    // OpenAI's model object adds `object` and `root` (the id an alias stands for).
    expect(propertiesOf("Model")).toStrictEqual(sorted([...restNamesOf(ModelSchema), "object", "root"]));
    expect(propertiesOf("Usage")).toStrictEqual(
      sorted([...restNamesOf(UsageSchema), "prompt_tokens_details"]),
    );
  });

  it("the error envelope lists every code of the catalogue a caller can get; each status (here: of an unknown route) its own codes and type", () => {
    const envelope = schemas.ErrorEnvelope as { properties: { error: { properties: { code: JsonSchema } } } };
    const codes = (envelope.properties.error.properties.code as { anyOf: Array<{ enum?: string[] }> })
      .anyOf[0]?.enum;
    expect(sorted(codes ?? [])).toStrictEqual(
      sorted(Object.keys(errorCatalogue).filter((c) => c !== "canceled")),
    );
    const checker = createOpenApiChecker();
    const headers = new Headers({
      "content-type": "application/json",
      "x-request-id": `req_${"a".repeat(32)}`,
    });
    for (const [code, kind] of Object.entries(errorCatalogue)) {
      if (code === "canceled") continue;
      expect(errorStatuses).toContain(kind.status);
      expect(errorCodesOfStatus(kind.status)).toContain(code);
      const body = (c: string, type: string) =>
        JSON.stringify({
          error: { message: "m", type, param: null, code: c },
          request_id: `req_${"a".repeat(32)}`,
        });
      const answer = (status: number, text: string) =>
        checker.check({
          method: "POST",
          url: "http://h/v1/unknown",
          status,
          headers,
          body: text,
          complete: true,
        });
      expect(answer(kind.status, body(code, kind.type))).toStrictEqual([]);
      // Another status's code, or another type, under this status is refused.
      const other = Object.entries(errorCatalogue).find(
        ([, k]) => k.status !== kind.status && k.status !== 499,
      );
      expect(answer(kind.status, body(other?.[0] ?? "", kind.type))).not.toStrictEqual([]);
      expect(
        answer(
          kind.status,
          body(code, kind.type === "server_error" ? "invalid_request_error" : "server_error"),
        ),
      ).not.toStrictEqual([]);
    }
  });

  it("POST /v1/completions documents every status of the catalogue but 405 (its path takes POST)", () => {
    const documented = Object.keys(openApiDocument.paths["/v1/completions"]?.post?.responses ?? {});
    expect(sorted(documented)).toStrictEqual(
      sorted(["200", ...errorStatuses.filter((s) => s !== 405).map(String)]),
    );
  });

  it("the request schemas are the protos' rules: a body validates exactly when the REST decoder and the proto's field rules take it", async () => {
    const checker = createOpenApiChecker();
    const takes = (body: unknown) => {
      try {
        validateRequest(decodeCompletionRequest(JSON.stringify(body)).request);
        return true;
      } catch {
        return false;
      }
    };
    const vector = { activations: [[1, 2]], layer_indices: [0] };
    // Each field at and past its bounds (cross-field rules, such as n > 1 with a greedy
    // temperature, and the model's facts are the service's: they are left out here).
    const fields: Record<string, unknown[]> = {
      model: ["", "m", 1, null],
      prompt: ["", "p", [], [""], ["a", "b"], [0], [-1], [2 ** 31 - 1], [2 ** 31], [1.5], [[]], [[1], [2]]],
      max_tokens: [0, 1, 2 ** 31 - 1, 2 ** 31, 1.5, "1", 2.0],
      n: [0, 1, 128, 129],
      temperature: [-0.1, 0, 2, 2.1],
      top_p: [0, 0.5, 1, 1.1],
      stop: ["", "x", [], ["a", "b", "c", "d"], ["a", "b", "c", "d", "e"], [""], [1]],
      stream: [true, false, "true"],
      stream_options: [{ include_usage: true }, { other: 1 }, []],
      logprobs: [-1, 0, 20, 21],
      echo: [true, 1],
      presence_penalty: [-2.1, -2, 2, 2.1],
      frequency_penalty: [-2.1, -2, 2, 2.1],
      seed: [-5, 5, 1.5],
      user: ["x".repeat(256), "x".repeat(257)],
      top_k: [-2, -1, 0, 5],
      min_p: [-0.1, 0, 1, 1.1],
      repetition_penalty: [0, 0.1, 2, 2.1],
      min_tokens: [-1, 0, 3],
      stop_token_ids: [[], [-1], [0], [2 ** 31]],
      bad_words: [
        [],
        ["it"],
        [""],
        [" "],
        ["x".repeat(100)],
        ["x".repeat(101)],
        Array(64).fill("a"),
        Array(65).fill("a"),
        "it",
        [1],
        [null],
      ],
      prompt_logprobs: [-1, 0, 20, 21],
      // A string priority's int32 range is not the pattern's (`"2147483648"`: a 400 the schema takes).
      priority: [-3, "2", "-3", "2.0", "x", 2 ** 31],
      output_residual_stream: [true, false, [0, 1], [0, 0], [-1], [2 ** 31]],
      apply_steering_vectors: [
        [],
        [vector],
        [{ ...vector, layer_indices: [] }],
        [{ ...vector, layer_indices: [0, 0] }],
        [{ layer_indices: [0] }],
        [{ ...vector, position_indices: [-1] }],
        [{ ...vector, scale: 2, norm_match: true }],
        [{ ...vector, other: 1 }],
      ],
      best_of: [2],
    };
    const bodies = Object.entries(fields).flatMap(([name, values]) =>
      values.map((value) => ({ model: "m", prompt: "p", [name]: value })),
    );
    for (const body of [...bodies, { prompt: "p" }, { model: "m" }]) {
      expect({ body, valid: checker.validate("CompletionRequest", body).length === 0 }).toStrictEqual({
        body,
        valid: takes(body),
      });
    }
    const tokens = { "/tokenize": decodeTokenizeRequest, "/detokenize": decodeDetokenizeRequest };
    const tokensBodies: Record<string, unknown[]> = {
      "/tokenize": [
        { model: "m", prompt: "" },
        { model: "", prompt: "p" },
        { model: "m" },
        { model: "m", prompt: null },
      ],
      "/detokenize": [
        { model: "m", tokens: [0] },
        { model: "m", tokens: [] },
        { model: "m", tokens: [-1] },
      ],
    };
    for (const [path, decode] of Object.entries(tokens)) {
      const name = path === "/tokenize" ? "TokenizeRequest" : "DetokenizeRequest";
      for (const body of tokensBodies[path] ?? []) {
        let taken = true;
        try {
          validateTokensRequest(await decode(new TextEncoder().encode(JSON.stringify(body))));
        } catch {
          taken = false;
        }
        expect({ body, valid: checker.validate(name, body).length === 0 }).toStrictEqual({
          body,
          valid: taken,
        });
      }
    }
  });

  it("a protovalidate rule the generator cannot state fails the build instead of being left out", () => {
    // acs.v1.Tensor's dtype is `not_in: [0]`: REST has its own form of a tensor (vllm-lens's).
    const table = { components: {}, messageForms: {}, fieldForms: {}, docs: {} };
    expect(() => messageObjectSchema(TensorSchema, table)).toThrow(/not_in has no OpenAPI form/);
  });

  it("the request examples validate and the REST decoder takes them", () => {
    const checker = createOpenApiChecker();
    const body = openApiDocument.paths["/v1/completions"]?.post?.requestBody as
      | { content: Record<string, { examples: Record<string, { value: unknown }> }> }
      | undefined;
    const media = body?.content["application/json"];
    const examples = Object.values(media?.examples ?? {});
    expect(examples.length).toBeGreaterThan(0);
    for (const { value } of examples) {
      expect(checker.validate("CompletionRequest", value)).toStrictEqual([]);
      expect(() => decodeCompletionRequest(JSON.stringify(value))).not.toThrow();
    }
    // A field the decoder refuses is refused by the schema too.
    expect(checker.validate("CompletionRequest", { model: "m", prompt: "p", best_of: 2 })).not.toStrictEqual(
      [],
    );
  });

  it("what the renderers write validates: a completion with every option, chunks, the model list", () => {
    const checker = createOpenApiChecker();
    const head = { id: `cmpl-${"0".repeat(32)}`, created: 1_700_000_000n, model: "tiny" };
    const logprobs = {
      content: [
        {
          token: "a",
          logprob: -0.5,
          textOffset: 0,
          topLogprobs: { values: [{ token: "a", logprob: -0.5 }] },
        },
        { token: "b", textOffset: 1 },
      ],
    };
    const choice = {
      index: 0,
      text: "ab",
      logprobs,
      finishReason: FinishReason.STOP,
      stopReason: { case: "stopTokenId" as const, value: 7 },
      promptTokenIds: [1, 2],
      tokenIds: [3, 4],
      promptLogprobs: [{ values: [] }, { values: [{ tokenId: 2, logprob: -1, rank: 1, decodedToken: "x" }] }],
    };
    const activations = {
      residualStream: { dtype: Dtype.BFLOAT16, shape: [1, 2, 2], data: new Uint8Array(8) },
    };
    const usage = { promptTokens: 2, completionTokens: 2, totalTokens: 4 };
    const completion = renderCompletion(
      create(CreateCompletionResponseSchema, { ...head, choices: [choice], usage, activations }),
      { returnTokenIds: true },
    );
    expect(checker.validate("Completion", completion)).toStrictEqual([]);
    const chunks = [
      create(StreamCompletionResponseSchema, { ...head, choices: [{ index: 0, text: "a" }] }),
      create(StreamCompletionResponseSchema, { ...head, choices: [choice], usage }),
      create(StreamCompletionResponseSchema, { ...head, usage }),
      create(StreamCompletionResponseSchema, { ...head, activations }),
    ].map((c) => renderChunk(c, { returnTokenIds: true }));
    for (const chunk of chunks) expect(checker.validate("CompletionStreamEvent", chunk)).toStrictEqual([]);
    const models = renderModelList(
      create(ListModelsResponseSchema, {
        data: [
          {
            id: "acs/tiny",
            created: 1n,
            ownedBy: "acs",
            aliases: ["tiny"],
            maxModelLen: 512,
            hiddenSize: 64,
            numHiddenLayers: 4,
          },
        ],
      }),
    );
    expect(checker.validate("ModelList", models)).toStrictEqual([]);
    // And a wrong one does not: a key the document does not have, a missing key, a wrong type.
    expect(checker.validate("Completion", { ...completion, extra: 1 })).not.toStrictEqual([]);
    const { usage: _dropped, ...withoutUsage } = completion;
    expect(checker.validate("Completion", withoutUsage)).not.toStrictEqual([]);
    expect(
      checker.validate("ModelList", { ...models, data: [{ ...models.data[0], created: "1" }] }),
    ).not.toStrictEqual([]);
  });
});

describe("the response checker of the end-to-end tests (test/helpers/openapi-check.ts)", () => {
  const checker = createOpenApiChecker();
  const requestId = `req_${"b".repeat(32)}`;
  const chunk = {
    id: `cmpl-${"1".repeat(32)}`,
    object: "text_completion",
    created: 1,
    model: "tiny",
    choices: [
      {
        index: 0,
        text: "a",
        logprobs: null,
        finish_reason: null,
        stop_reason: null,
        prompt_token_ids: null,
        token_ids: null,
      },
    ],
    usage: null,
  };
  const stream = (body: string, complete = true, headers: Record<string, string> = {}) =>
    checker.check({
      method: "POST",
      url: "http://h/v1/completions",
      status: 200,
      headers: new Headers({
        "content-type": "text/event-stream; charset=utf-8",
        "x-request-id": requestId,
        ...headers,
      }),
      body,
      complete,
    });
  const data = (value: unknown) => `data: ${JSON.stringify(value)}\n\n`;

  it("takes a stream of chunks, keepalives, an error event and [DONE]", () => {
    const envelope = {
      error: { message: "m", type: "server_error", param: null, code: "upstream_error" },
      request_id: requestId,
    };
    expect(stream(`: keepalive\n\n${data(chunk)}${data(envelope)}data: [DONE]\n\n`)).toStrictEqual([]);
    // Cut short by the reader: no [DONE] needed.
    expect(stream(data(chunk), false)).toStrictEqual([]);
  });

  it("refuses what the document does not allow", () => {
    const problems = [
      stream(`event: x\n${data(chunk)}data: [DONE]\n\n`),
      stream(data(chunk)),
      stream(`${data({ ...chunk, extra: 1 })}data: [DONE]\n\n`),
      stream(`data: [DONE]\n\n${data(chunk)}`),
      stream("data: {\n\ndata: [DONE]\n\n"),
      stream("data: [DONE]\n\n", true, { "x-request-id": "nope" }),
      checker.check({
        method: "GET",
        url: "http://h/v1/models",
        status: 200,
        headers: new Headers({ "content-type": "text/plain", "x-request-id": requestId }),
        body: "x",
        complete: true,
      }),
      checker.check({
        method: "GET",
        url: "http://h/v1/models",
        status: 418,
        headers: new Headers({ "content-type": "application/json", "x-request-id": requestId }),
        body: "{}",
        complete: true,
      }),
      checker.check({
        method: "GET",
        url: "http://h/v1/models",
        status: 200,
        headers: new Headers({ "content-type": "application/json" }),
        body: JSON.stringify({ object: "list", data: [] }),
        complete: true,
      }),
    ];
    for (const found of problems) expect(found).not.toStrictEqual([]);
  });
});
