// A prompt list no size cap allows (more than 32,000 prompts: prompts × n × max_tokens ≤ 32,000
// with n, max_tokens ≥ 1, proto/API.md §3) gets one refusal on every surface — REST, Connect JSON
// and binary (unary and streaming), gRPC, gRPC-Web — and the JSON parsers give it while they read
// the list: what follows it in the body (a syntax error, an unknown field) is never read.
import { create, toBinary } from "@bufbuild/protobuf";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { errorCatalogue } from "../../src/core/errors/index.js";
import { decodeError, type ErrorForm, exchange, frame, type WireRequest } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});

const UNARY = "/acs.v1.CompletionsService/CreateCompletion";
const STREAM = "/acs.v1.CompletionsService/StreamCompletion";
const PROMPTS = 32_001;
const MESSAGE =
  "At most 32000 generated tokens in all: a request with more than 32000 prompts asks for more, whatever n and max_tokens are (at least 1 each).";

type Surface =
  | "rest"
  | "connect-json"
  | "connect-proto"
  | "connect-stream"
  | "grpc"
  | "grpc-web"
  | "grpc-web-json";
const formOf: Record<Surface, ErrorForm> = {
  rest: "rest",
  "connect-json": "connect",
  "connect-proto": "connect",
  "connect-stream": "connect-stream",
  grpc: "grpc",
  "grpc-web": "grpc-web",
  "grpc-web-json": "grpc-web",
};

const texts = Array.from({ length: PROMPTS }, (_, i) => `p${i}`);
const lists = Array.from({ length: PROMPTS }, (_, i) => [i % 100]);
const shapes = {
  strings: {
    rest: { prompt: texts },
    json: { texts: { values: texts } },
    proto: { case: "texts", value: { values: texts } },
  },
  "token-id lists": {
    rest: { prompt: lists },
    json: { tokenIdsList: { values: lists.map((values) => ({ values })) } },
    proto: { case: "tokenIdsList", value: { values: lists.map((values) => ({ values })) } },
  },
} as const;

function requestOf(surface: Surface, shape: keyof typeof shapes): WireRequest {
  const s = shapes[shape];
  const json = new TextEncoder().encode(JSON.stringify({ model: "tiny", maxTokens: 1, ...s.json }));
  const proto = toBinary(
    CreateCompletionRequestSchema,
    create(CreateCompletionRequestSchema, { model: "tiny", maxTokens: 1, prompt: s.proto }),
  );
  switch (surface) {
    case "rest":
      return {
        path: "/v1/completions",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", max_tokens: 1, ...s.rest }),
      };
    case "connect-json":
      return { path: UNARY, headers: { "content-type": "application/json" }, body: json };
    case "connect-proto":
      return { path: UNARY, headers: { "content-type": "application/proto" }, body: proto };
    case "connect-stream":
      return { path: STREAM, headers: { "content-type": "application/connect+proto" }, body: frame(proto) };
    case "grpc":
      return {
        http2: true,
        path: UNARY,
        headers: { "content-type": "application/grpc" },
        body: frame(proto),
      };
    case "grpc-web":
      return { path: UNARY, headers: { "content-type": "application/grpc-web+proto" }, body: frame(proto) };
    case "grpc-web-json":
      return { path: UNARY, headers: { "content-type": "application/grpc-web+json" }, body: frame(json) };
  }
}

const surfaces = Object.keys(formOf) as Surface[];
const kind = errorCatalogue.invalid_request;

describe.each(Object.keys(shapes) as (keyof typeof shapes)[])("32,001 prompts as %s", (shape) => {
  it.each(surfaces)("%s: the size cap's envelope and param", async (surface) => {
    const res = await exchange(stack.url, requestOf(surface, shape));
    const error = decodeError(formOf[surface], res);
    expect(error.envelope).toMatchObject({
      code: "invalid_request",
      type: kind.type,
      param: "max_tokens",
      message: MESSAGE,
    });
    expect(error.protocolMessage).toBe(MESSAGE);
    expect(error.envelope.requestId).toBe(error.requestIdHeader);
    const form = formOf[surface];
    if (form === "rest") expect(res.status).toBe(400);
    else if (form === "connect") {
      expect(res.status).toBe(400);
      expect(error.protocolCode).toBe(codeToString(kind.connectCode));
    } else if (form === "connect-stream") expect(error.protocolCode).toBe(codeToString(kind.connectCode));
    else expect(error.protocolCode).toBe(kind.connectCode);
  });
});

describe("the JSON parsers refuse the list while they read it", () => {
  // 40,000 prompts, then a fault far later in the body that the parse would refuse if it got there.
  const many = JSON.stringify(Array.from({ length: 40_000 }, (_, i) => `p${i}`));
  const filler = `"${"x".repeat(1_000_000)}"`;
  const cases = [
    ["a syntax error", `"user": ${filler}, "n": 1,, }`],
    ["an unknown field", `"user": ${filler}, "best_of": 2}`],
    ["a wrong type", `"user": ${filler}, "n": "two"}`],
  ] as const;

  it.each(cases)("REST: the prompt list, not %s after it", async (_name, rest) => {
    const body = `{"model": "tiny", "max_tokens": 1, "prompt": ${many}, ${rest}`;
    const error = decodeError("rest", await exchange(stack.url, requestOf("rest", "strings")));
    const late = decodeError(
      "rest",
      await exchange(stack.url, {
        path: "/v1/completions",
        headers: { "content-type": "application/json" },
        body,
      }),
    );
    expect(late.envelope).toMatchObject({ param: "max_tokens", message: MESSAGE });
    expect(late.envelope.message).toBe(error.envelope.message);
  });

  it.each(cases)("Connect JSON and gRPC-Web JSON: the prompt list, not %s after it", async (_name, rest) => {
    const body = new TextEncoder().encode(
      `{"model": "tiny", "maxTokens": 1, "texts": {"values": ${many}}, ${rest}`,
    );
    const connect = decodeError(
      "connect",
      await exchange(stack.url, { path: UNARY, headers: { "content-type": "application/json" }, body }),
    );
    const grpcWeb = decodeError(
      "grpc-web",
      await exchange(stack.url, {
        path: UNARY,
        headers: { "content-type": "application/grpc-web+json" },
        body: frame(body),
      }),
    );
    for (const e of [connect, grpcWeb])
      expect(e.envelope).toMatchObject({ param: "max_tokens", message: MESSAGE });
  });

  it("a long list of token ids is one prompt, not a list of prompts", async () => {
    const ids = Array.from({ length: 40_000 }, (_, i) => i % 100);
    const res = await exchange(stack.url, {
      path: "/v1/completions",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", max_tokens: 1, prompt: ids }),
    });
    const error = decodeError("rest", res);
    // Too long for the tiny model: refused for its length, never as a list of prompts.
    expect(error.envelope.code).toBe("context_length_exceeded");
  });

  it("32,000 prompts are not refused by the parser", async () => {
    const res = await exchange(stack.url, {
      path: "/v1/completions",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", max_tokens: 2, prompt: texts.slice(0, 32_000) }),
    });
    const error = decodeError("rest", res);
    expect(error.envelope).toMatchObject({ param: "max_tokens" });
    expect(error.envelope.message).toBe(
      "At most 32000 generated tokens in all: n = 1 times max_tokens = 2 for each of 32000 prompts is 64000.",
    );
  });
});

describe("the binary decoders count the list on the wire, before protobuf-es decodes it", () => {
  const binaryForms = ["connect-proto", "connect-stream", "grpc", "grpc-web"] as const;
  const encode = (prompt: { case: "texts"; value: { values: string[] } } | { case: "text"; value: string }) =>
    toBinary(
      CreateCompletionRequestSchema,
      create(CreateCompletionRequestSchema, { model: "tiny", maxTokens: 1, prompt }),
    );
  const list = (n: number) => encode({ case: "texts", value: { values: texts.slice(0, n) } });
  // `user` (field 17) holding the byte 0xff: well-formed wire bytes, invalid UTF-8 for protobuf-es.
  const badUser = Uint8Array.of(0x8a, 0x01, 0x01, 0xff);
  const concat = (...parts: Uint8Array[]) => Buffer.concat(parts);

  function send(surface: (typeof binaryForms)[number], message: Uint8Array) {
    const request = requestOf(surface, "strings");
    const body = surface === "connect-proto" ? message : frame(message);
    return exchange(stack.url, { ...request, body });
  }

  it.each(binaryForms)("%s: the prompt list, not the invalid UTF-8 after it", async (surface) => {
    const error = decodeError(formOf[surface], await send(surface, concat(list(PROMPTS), badUser)));
    expect(error.envelope).toMatchObject({ param: "max_tokens", message: MESSAGE });
    // The same fault with a short list is protobuf-es's, so the count came first.
    const short = decodeError(formOf[surface], await send(surface, concat(list(2), badUser)));
    expect(short.envelope.message).toMatch(/not a valid protobuf encoding/);
  });

  it.each(binaryForms)("%s: a list given twice is merged, as protobuf-es reads it", async (surface) => {
    const half = list(16_001);
    const error = decodeError(formOf[surface], await send(surface, concat(half, half)));
    expect(error.envelope).toMatchObject({ param: "max_tokens", message: MESSAGE });
  });

  it("a list replaced by a later single prompt (the oneof's last member wins) is one prompt", async () => {
    const res = await send("connect-proto", concat(list(PROMPTS), encode({ case: "text", value: "hi" })));
    expect(res.status).toBe(200);
  });
});
