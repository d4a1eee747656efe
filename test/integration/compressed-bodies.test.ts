// Compressed request bodies on every surface: REST decodes Content-Encoding gzip, deflate and br
// (it used to ignore the header), Connect, gRPC and gRPC-Web take the same codings, and a
// compression bomb is refused with 413 request_too_large, in the envelope, on each.
import * as zlib from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { assertConforming, checkedExchange as exchange } from "../helpers/openapi-check.js";
import { decodeError, frame } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});
// Every REST answer also conforms to /openapi.json (checkedExchange).
afterEach(assertConforming);

const MIB = 1024 * 1024;
const UNARY = "/acs.v1.CompletionsService/CreateCompletion";
const restJson = Buffer.from(
  JSON.stringify({ model: "tiny", prompt: "The sky is", max_tokens: 2, temperature: 0 }),
);
const rpcJson = Buffer.from(
  JSON.stringify({ model: "tiny", text: "The sky is", maxTokens: 2, temperature: 0 }),
);
const rpcProto = toBinary(
  CreateCompletionRequestSchema,
  create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: { case: "text", value: "The sky is" },
    maxTokens: 2,
    temperature: 0,
  }),
);

const compress: Record<string, (b: Uint8Array) => Buffer> = {
  gzip: (b) => zlib.gzipSync(b),
  deflate: (b) => zlib.deflateSync(b),
  br: (b) => zlib.brotliCompressSync(b),
};

/** 1 GiB of JSON-ish zeros in ~1 MiB of gzip (1024 concatenated members). */
const gzipBomb = (() => {
  const member = zlib.gzipSync(Buffer.alloc(MIB, 0x20), { level: 9 });
  return Buffer.concat(Array.from({ length: 1024 }, () => member));
})();
const tooLarge = "The request body is too large: at most 8388608 bytes (8 MiB).";

describe.each(["gzip", "deflate", "br"])("%s", (coding) => {
  const encode = compress[coding] as (b: Uint8Array) => Buffer;

  it("REST decodes the body", async () => {
    const res = await exchange(stack.url, {
      path: "/v1/completions",
      headers: { "content-type": "application/json", "content-encoding": coding },
      body: encode(restJson),
    });
    expect(res.status, res.body.toString()).toBe(200);
    expect(
      (JSON.parse(res.body.toString()) as { usage: { completion_tokens: number } }).usage.completion_tokens,
    ).toBe(2);
  });

  it("Connect unary (JSON) decodes the body", async () => {
    const res = await exchange(stack.url, {
      path: UNARY,
      headers: { "content-type": "application/json", "content-encoding": coding },
      body: encode(rpcJson),
    });
    expect(res.status, res.body.toString()).toBe(200);
  });

  it("gRPC decodes a compressed message", async () => {
    const res = await exchange(stack.url, {
      http2: true,
      path: UNARY,
      headers: { "content-type": "application/grpc", "grpc-encoding": coding },
      body: frame(encode(rpcProto), 1),
    });
    expect(res.trailers.get("grpc-status")).toBe("0");
  });

  it("gRPC-Web decodes a compressed message", async () => {
    const res = await exchange(stack.url, {
      path: UNARY,
      headers: { "content-type": "application/grpc-web+proto", "grpc-encoding": coding },
      body: frame(encode(rpcProto), 1),
    });
    expect(res.body.toString("latin1")).toContain("grpc-status: 0");
  });
});

describe("refusals", () => {
  it("REST: a plain body labelled br is 400, not read as JSON", async () => {
    const res = await exchange(stack.url, {
      path: "/v1/completions",
      headers: { "content-type": "application/json", "content-encoding": "br" },
      body: restJson,
    });
    const error = decodeError("rest", res);
    expect(error.httpStatus).toBe(400);
    expect(error.envelope).toMatchObject({
      code: "invalid_request",
      message: "The request body is not valid br data.",
    });
  });

  it("REST: a gzip bomb (1 GiB from 1 MiB) is 413 request_too_large", async () => {
    const res = await exchange(stack.url, {
      path: "/v1/completions",
      headers: { "content-type": "application/json", "content-encoding": "gzip" },
      body: gzipBomb,
    });
    const error = decodeError("rest", res);
    expect(error.httpStatus).toBe(413);
    expect(error.envelope).toMatchObject({ code: "request_too_large", message: tooLarge });
    expect(error.envelope.requestId).toBe(error.requestIdHeader);
  });

  it("Connect unary: a gzip bomb is 413 request_too_large with the envelope", async () => {
    const res = await exchange(stack.url, {
      path: UNARY,
      headers: { "content-type": "application/json", "content-encoding": "gzip" },
      body: gzipBomb,
    });
    const error = decodeError("connect", res);
    expect(error.httpStatus).toBe(413);
    expect(error.protocolCode).toBe("resource_exhausted");
    expect(error.envelope).toMatchObject({ code: "request_too_large", message: tooLarge });
  });

  it("gRPC: a deflate bomb is RESOURCE_EXHAUSTED request_too_large with the envelope", async () => {
    const bomb = zlib.deflateSync(Buffer.alloc(64 * MIB), { level: 1 });
    const res = await exchange(stack.url, {
      http2: true,
      path: UNARY,
      headers: { "content-type": "application/grpc", "grpc-encoding": "deflate" },
      body: frame(bomb, 1),
    });
    const error = decodeError("grpc", res);
    expect(error.protocolCode).toBe(8);
    expect(error.envelope).toMatchObject({ code: "request_too_large", message: tooLarge });
  });

  it("the gateway still serves after the bombs", async () => {
    const res = await exchange(stack.url, {
      path: "/v1/completions",
      headers: { "content-type": "application/json" },
      body: restJson,
    });
    expect(res.status).toBe(200);
  });
});
