import { describe, expect, it } from "vitest";
import { ApiError, type ErrorCode } from "../../src/core/errors/index.js";
import { isVllmErrorBody, mapUpstreamError, parseVllmError } from "../../src/upstream/index.js";

/** The three body forms vLLM uses for one error. */
const forms = (message: string, type: string, param: string | null, code: number) => ({
  nested: JSON.stringify({ error: { message, type, param, code } }),
  flat: JSON.stringify({ object: "error", message, type, param, code }),
});

interface Row {
  name: string;
  status: number;
  message: string;
  param: string | null;
  vllmCode: number;
  want: { code: ErrorCode; param: string | null; message?: string };
}

const rows: Row[] = [
  {
    name: "400 passed on with message and param",
    status: 400,
    message: "Token id 128300 is out of vocabulary",
    param: "prompt",
    vllmCode: 400,
    want: { code: "invalid_request", param: "prompt", message: "Token id 128300 is out of vocabulary" },
  },
  {
    name: "400 out of vocabulary without a param (a stream's in-band error): param prompt",
    status: 400,
    message: "Token id 128300 is out of vocabulary",
    param: null,
    vllmCode: 400,
    want: { code: "invalid_request", param: "prompt", message: "Token id 128300 is out of vocabulary" },
  },
  {
    name: "400 with decoration: cut when param keeps it",
    status: 400,
    message:
      "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)",
    param: "logprobs",
    vllmCode: 400,
    want: {
      code: "invalid_request",
      param: "logprobs",
      message: "Requested sample logprobs of 21, which is greater than max allowed: 20",
    },
  },
  {
    name: "400 with decoration and no param: param from the decoration",
    status: 400,
    message: "temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)",
    param: null,
    vllmCode: 400,
    want: {
      code: "invalid_request",
      param: "temperature",
      message: "temperature must be in [0, 2], got 2.5.",
    },
  },
  {
    name: "400 whose decoration names another param: kept as it is",
    status: 400,
    message: "bad value (parameter=top_k, value=-2)",
    param: "sampling",
    vllmCode: 400,
    want: { code: "invalid_request", param: "sampling", message: "bad value (parameter=top_k, value=-2)" },
  },
  {
    name: "prompt too long (param input_tokens)",
    status: 400,
    message:
      "You passed 9000 input tokens and requested 16 output tokens. However, the model's context length is only 8192 tokens, resulting in a maximum input length of 8176 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=9000)",
    param: "input_tokens",
    vllmCode: 400,
    want: { code: "context_length_exceeded", param: "prompt" },
  },
  {
    name: "prompt too long (older message)",
    status: 400,
    message: "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
    param: null,
    vllmCode: 400,
    want: { code: "context_length_exceeded", param: "prompt" },
  },
  {
    name: "404 model",
    status: 404,
    message: "The model `nope` does not exist.",
    param: "model",
    vllmCode: 404,
    want: { code: "model_not_found", param: "model" },
  },
  {
    name: "422 validation",
    status: 422,
    message: "Input should be a valid integer",
    param: "n",
    vllmCode: 422,
    want: { code: "invalid_request", param: "n" },
  },
  {
    name: "401",
    status: 401,
    message: "Unauthorized",
    param: null,
    vllmCode: 401,
    want: { code: "upstream_error", param: null },
  },
  {
    name: "403",
    status: 403,
    message: "Forbidden",
    param: null,
    vllmCode: 403,
    want: { code: "upstream_error", param: null },
  },
  {
    name: "429",
    status: 429,
    message: "Too many requests",
    param: null,
    vllmCode: 429,
    want: { code: "upstream_unavailable", param: null },
  },
  {
    name: "500",
    status: 500,
    message: "EngineCore died: Traceback …",
    param: null,
    vllmCode: 500,
    want: { code: "upstream_error", param: null },
  },
  {
    name: "503",
    status: 503,
    message: "The engine is dead",
    param: null,
    vllmCode: 503,
    want: { code: "upstream_unavailable", param: null },
  },
  {
    name: "501",
    status: 501,
    message: "Not implemented",
    param: null,
    vllmCode: 501,
    want: { code: "upstream_error", param: null },
  },
];

function check(err: ApiError, row: Row): void {
  expect(err).toBeInstanceOf(ApiError);
  expect(err.code).toBe(row.want.code);
  expect(err.param).toBe(row.want.param);
  if (row.want.message !== undefined) expect(err.message).toBe(row.want.message);
  // Inference's class-name type and integer code never reach callers.
  expect(err.message).not.toMatch(/BadRequestError|InternalServerError|NotFoundError/);
  if (row.status >= 500 || row.status === 401 || row.status === 403)
    expect(err.message).not.toContain(row.message);
}

describe("mapUpstreamError: vLLM error bodies", () => {
  for (const row of rows) {
    const type =
      row.status >= 500 ? "InternalServerError" : row.status === 404 ? "NotFoundError" : "BadRequestError";
    const bodies = forms(row.message, type, row.param, row.vllmCode);
    for (const [form, body] of Object.entries(bodies)) {
      it(`${row.name} (${form}, HTTP ${row.status})`, () => {
        check(mapUpstreamError({ kind: "response", status: row.status, body }), row);
      });
      it(`${row.name} (${form}, HTTP 200: the body's code is the status)`, () => {
        check(mapUpstreamError({ kind: "response", status: 200, body }), row);
      });
      it(`${row.name} (${form}, in-band stream event)`, () => {
        check(mapUpstreamError({ kind: "event", body: JSON.parse(body) }), row);
      });
    }
  }

  it.each([
    ["string error with 401", 401, '{"error": "Unauthorized"}', "upstream_error"],
    ["string error with 200 (no code)", 200, '{"error": "Unauthorized"}', "upstream_error"],
    ["error body with 200 and no code", 200, '{"error": {"message": "odd"}}', "upstream_error"],
    ["bare 404 (a wrong route)", 404, '{"detail": "Not Found"}', "upstream_error"],
    ["unparseable 400", 400, "<html>Bad Request</html>", "upstream_error"],
    ["unparseable 500", 500, "Internal Server Error", "upstream_error"],
    ["unparseable 503", 503, "", "upstream_unavailable"],
    ["unparseable 401", 401, "", "upstream_error"],
    [
      "error with a string code",
      400,
      '{"error": {"message": "m", "code": "x", "param": "n"}}',
      "invalid_request",
    ],
  ] as const)("%s → %s", (_, status, body, code) => {
    expect(mapUpstreamError({ kind: "response", status, body }).code).toBe(code);
  });
});

describe("mapUpstreamError: Inference's text is clipped (200 KB messages and params)", () => {
  const huge = "x".repeat(200_000);
  const body = (message: string, param: string | null) =>
    JSON.stringify({ error: { message, type: "BadRequestError", param, code: 400 } });

  it("a 400's message is cut to 1,024 characters + … and its param to 200 + …", () => {
    const err = mapUpstreamError({ kind: "response", status: 400, body: body(huge, "p".repeat(200_000)) });
    expect(err.code).toBe("invalid_request");
    expect(err.message).toBe(`${"x".repeat(1024)}…`);
    expect(err.param).toBe(`${"p".repeat(200)}…`);
  });

  it("the decoration is cut off the whole message before clipping", () => {
    const err = mapUpstreamError({
      kind: "response",
      status: 400,
      body: body(`${huge} (parameter=n, value=${huge})`, null),
    });
    expect(err.param).toBe("n");
    expect(err.message).toBe(`${"x".repeat(1024)}…`);
  });

  it.each([
    [
      "context length (in-band)",
      { kind: "event", body: JSON.parse(body(`context length ${huge}`, "input_tokens")) },
    ],
    [
      "model not found",
      { kind: "response", status: 404, body: body(`The model ${huge} does not exist`, null) },
    ],
  ] as const)("%s", (_name, failure) => {
    const err = mapUpstreamError(failure);
    expect(err.message).toHaveLength(1025);
    expect(err.message.endsWith("…")).toBe(true);
  });

  it("a message within the bound is passed on whole", () => {
    const message = "y".repeat(1024);
    expect(mapUpstreamError({ kind: "response", status: 400, body: body(message, null) }).message).toBe(
      message,
    );
  });
});

const withCode = (code: string, extra: Record<string, unknown> = {}) =>
  Object.assign(new Error("some message that must not matter"), { code, ...extra });

describe("mapUpstreamError: transport errors by code", () => {
  it.each([
    ["ECONNREFUSED", false, "upstream_unavailable"],
    ["ENOTFOUND", false, "upstream_unavailable"],
    ["EAI_AGAIN", false, "upstream_unavailable"],
    ["EHOSTUNREACH", false, "upstream_unavailable"],
    ["UND_ERR_CONNECT_TIMEOUT", false, "upstream_unavailable"],
    ["ECONNRESET", false, "upstream_unavailable"],
    ["UND_ERR_SOCKET", false, "upstream_unavailable"],
    ["ECONNRESET", true, "upstream_error"],
    ["UND_ERR_SOCKET", true, "upstream_error"],
    ["EPIPE", true, "upstream_error"],
    ["UND_ERR_HEADERS_TIMEOUT", false, "deadline_exceeded"],
    ["UND_ERR_BODY_TIMEOUT", true, "deadline_exceeded"],
    ["UND_ERR_ABORTED", false, "canceled"],
    ["ABORT_ERR", true, "canceled"],
    ["UND_ERR_RES_CONTENT_LENGTH_MISMATCH", true, "upstream_error"],
    ["HPE_INVALID_CONSTANT", false, "upstream_error"],
    ["ESOMETHINGNEW", false, "upstream_error"],
  ] as const)("%s (response started: %s) → %s", (code, responseStarted, want) => {
    expect(mapUpstreamError({ kind: "transport", error: withCode(code), responseStarted }).code).toBe(want);
  });

  it("finds the code on a cause or inside an AggregateError (happy eyeballs)", () => {
    const wrapped = new Error("fetch failed", { cause: withCode("ECONNREFUSED") });
    expect(mapUpstreamError({ kind: "transport", error: wrapped, responseStarted: false }).code).toBe(
      "upstream_unavailable",
    );
    const agg = new AggregateError([withCode("ECONNREFUSED"), withCode("ECONNREFUSED")], "connect failed");
    expect(mapUpstreamError({ kind: "transport", error: agg, responseStarted: false }).code).toBe(
      "upstream_unavailable",
    );
  });

  it("passes an ApiError through unchanged, and maps non-errors to 502", () => {
    const own = new ApiError("deadline_exceeded", "late");
    expect(mapUpstreamError({ kind: "transport", error: own, responseStarted: true })).toBe(own);
    expect(mapUpstreamError({ kind: "transport", error: "weird", responseStarted: false }).code).toBe(
      "upstream_error",
    );
  });
});

describe("parseVllmError / isVllmErrorBody", () => {
  it("reads every form and only error bodies", () => {
    expect(parseVllmError({ error: "Unauthorized" })).toStrictEqual({
      message: "Unauthorized",
      type: null,
      param: null,
      code: null,
    });
    expect(parseVllmError({ object: "error", message: "m", type: "T", param: "p", code: 400 })).toStrictEqual(
      {
        message: "m",
        type: "T",
        param: "p",
        code: 400,
      },
    );
    expect(parseVllmError({ choices: [] })).toBeNull();
    expect(isVllmErrorBody({ error: null })).toBe(true);
    expect(isVllmErrorBody({ object: "error" })).toBe(true);
    expect(isVllmErrorBody({ object: "text_completion", choices: [] })).toBe(false);
    expect(isVllmErrorBody([{ error: 1 }])).toBe(false);
  });
});
