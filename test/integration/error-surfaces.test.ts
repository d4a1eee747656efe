// One error, every surface: each refusal below is sent over REST, Connect (JSON and binary, unary
// and streaming), gRPC and gRPC-Web, and each answer is decoded in its own protocol's form (REST
// envelope; Connect error JSON, in the body or the end-stream frame; gRPC trailers; gRPC-Web
// trailer frame; google.rpc.Status decoded with our own generated code). Every answer must carry
// the acs.v1.ErrorEnvelope with the same code, message, param and type, the protocol's code and
// status of the catalogue, and a request id equal to its X-Request-Id header — whoever raised the
// error (connect-es, fastify or the gateway).
import { create, toBinary } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { type ErrorCode, errorCatalogue } from "../../src/core/errors/index.js";
import { conformanceProblems } from "../helpers/openapi-check.js";
import { decodeError, type ErrorForm, exchange, frame, type WireRequest } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { type FakeUpstream, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

let upstream: FakeUpstream;
let stack: Stack;
beforeAll(async () => {
  // Inference that counts tokens and never answers a completion: the caller's deadline fires.
  upstream = await startFakeUpstream(
    withVllmOps((req, res, body) => {
      if (req.url === "/tokenize") {
        const { prompt } = JSON.parse(body) as { prompt: string };
        res.setHeader("content-type", "application/json");
        res.end(
          JSON.stringify({ count: prompt.length, max_model_len: 512, tokens: [...prompt].map(() => 1) }),
        );
      }
    }),
  );
  stack = await startStack({ upstreamUrl: upstream.url });
});
afterAll(async () => {
  await stack.close();
  await upstream.close();
});

const UNARY = "/acs.v1.CompletionsService/CreateCompletion";
const STREAM = "/acs.v1.CompletionsService/StreamCompletion";
const MIB = 1024 * 1024;

/** The surfaces: REST, Connect unary JSON and binary, Connect streaming, gRPC (h2c), gRPC-Web. */
type Surface = "rest" | "connect-json" | "connect-proto" | "connect-stream" | "grpc" | "grpc-web";
const surfaces: readonly Surface[] = [
  "rest",
  "connect-json",
  "connect-proto",
  "connect-stream",
  "grpc",
  "grpc-web",
];

const formOf: Record<Surface, ErrorForm> = {
  rest: "rest",
  "connect-json": "connect",
  "connect-proto": "connect",
  "connect-stream": "connect-stream",
  grpc: "grpc",
  "grpc-web": "grpc-web",
};

/** A request message in both codecs. */
interface Message {
  readonly json?: string;
  readonly proto?: Uint8Array;
}

/**
 * The request of an RPC surface carrying `message` (JSON where the case has JSON, else binary),
 * with `headers` added. The streaming protocols frame it; gRPC goes over HTTP/2.
 */
function rpcRequest(
  surface: Exclude<Surface, "rest">,
  message: Message,
  headers: Record<string, string> = {},
): WireRequest {
  const json = message.json !== undefined;
  const bytes = json ? new TextEncoder().encode(message.json) : (message.proto ?? new Uint8Array(0));
  switch (surface) {
    case "connect-json":
      return { path: UNARY, headers: { "content-type": "application/json", ...headers }, body: bytes };
    case "connect-proto":
      return { path: UNARY, headers: { "content-type": "application/proto", ...headers }, body: bytes };
    case "connect-stream":
      return {
        path: STREAM,
        headers: {
          "content-type": json ? "application/connect+json" : "application/connect+proto",
          ...headers,
        },
        body: frame(bytes),
      };
    case "grpc":
      return {
        http2: true,
        path: UNARY,
        headers: { "content-type": json ? "application/grpc+json" : "application/grpc", ...headers },
        body: frame(bytes),
      };
    case "grpc-web":
      return {
        path: UNARY,
        headers: {
          "content-type": json ? "application/grpc-web+json" : "application/grpc-web+proto",
          ...headers,
        },
        body: frame(bytes),
      };
  }
}

function rest(
  json: string,
  headers: Record<string, string> = { "content-type": "application/json" },
): WireRequest {
  return { path: "/v1/completions", headers, body: json };
}

const proto = (init: Parameters<typeof create<typeof CreateCompletionRequestSchema>>[1]) =>
  toBinary(CreateCompletionRequestSchema, create(CreateCompletionRequestSchema, init));

/** A cell of the table: the request a surface sends, or why the case does not exist there. */
type Cell = WireRequest | { readonly notApplicable: string };

interface Case {
  readonly name: string;
  readonly code: ErrorCode;
  readonly param: string | null;
  /** The message: one for every surface, or per surface (the path or Content-Type it names). */
  readonly message: string | RegExp | ((surface: Surface, req: WireRequest) => string);
  readonly cells: Record<Surface, Cell>;
  /** Extra checks of one answer (headers). */
  readonly also?: (surface: Surface, metadata: Headers) => void;
}

const JSON_ONLY = { notApplicable: "binary protobuf: this case is about JSON" } as const;
const BINARY_ONLY = { notApplicable: "JSON: this case is about binary protobuf" } as const;

/** The same JSON message (Connect names) on every JSON-capable RPC surface. */
function jsonRpcCells(json: string, headers: Record<string, string> = {}) {
  return {
    "connect-json": rpcRequest("connect-json", { json }, headers),
    "connect-proto": JSON_ONLY,
    "connect-stream": rpcRequest("connect-stream", { json }, headers),
    grpc: rpcRequest("grpc", { json }, headers),
    "grpc-web": rpcRequest("grpc-web", { json }, headers),
  };
}

/** The same message on every RPC surface (binary where no JSON is given). */
function allRpcCells(message: Message, headers: Record<string, string> = {}) {
  const binary = {
    proto: message.proto ?? proto({ model: "tiny", prompt: { case: "text", value: "Hi" }, maxTokens: 1 }),
  };
  return {
    "connect-json": rpcRequest(
      "connect-json",
      { json: message.json ?? '{"model":"tiny","text":"Hi","maxTokens":1}' },
      headers,
    ),
    "connect-proto": rpcRequest("connect-proto", binary, headers),
    "connect-stream": rpcRequest("connect-stream", binary, headers),
    grpc: rpcRequest("grpc", binary, headers),
    "grpc-web": rpcRequest("grpc-web", binary, headers),
  };
}

const contentTypeMessage = (surface: Surface, req: WireRequest): string => {
  if (surface === "rest") {
    return "Unsupported Content-Type: send the request body as JSON with 'Content-Type: application/json'.";
  }
  const types =
    req.path === STREAM
      ? "application/connect+json or application/connect+proto (Connect), application/grpc (gRPC) or application/grpc-web (gRPC-Web)"
      : "application/json or application/proto (Connect), application/grpc (gRPC) or application/grpc-web (gRPC-Web)";
  const sent = req.headers?.["content-type"];
  const what = sent === undefined ? "No Content-Type" : `Unsupported Content-Type '${sent}'`;
  return `${what} for ${req.path}: send ${types}.`;
};

/** A body of 8 MiB + 64 KiB in 64 KiB chunks, without Content-Length. */
function oversize(head: Uint8Array): Uint8Array[] {
  const chunk = new Uint8Array(64 * 1024).fill(0x61);
  return [head, ...Array.from({ length: 129 }, () => chunk)];
}

const bigText = "x".repeat(8 * MIB + 64 * 1024);
const bigProto = proto({ model: "tiny", prompt: { case: "text", value: bigText }, maxTokens: 1 });
const chunksOf = (bytes: Uint8Array): Uint8Array[] => {
  const out: Uint8Array[] = [];
  for (let i = 0; i < bytes.byteLength; i += 64 * 1024) out.push(bytes.subarray(i, i + 64 * 1024));
  return out;
};

const UNFRAMED = { notApplicable: "unframed: the body is the message itself" } as const;

/**
 * The framed RPC surfaces sending `body` as is (its frames, or none): Connect streaming
 * (StreamCompletion), gRPC and gRPC-Web (CreateCompletion, and StreamCompletion in `streamed`).
 */
function framedCells(body: Uint8Array, path = UNARY) {
  const framed = (surface: "connect-stream" | "grpc" | "grpc-web"): WireRequest => {
    const req = rpcRequest(surface, { proto: new Uint8Array(0) });
    return { ...req, path: surface === "connect-stream" ? STREAM : path, body };
  };
  return {
    rest: { notApplicable: "REST's body is JSON, not frames" },
    "connect-json": UNFRAMED,
    "connect-proto": UNFRAMED,
    "connect-stream": framed("connect-stream"),
    grpc: framed("grpc"),
    "grpc-web": framed("grpc-web"),
  };
}

const oneMessage = proto({ model: "tiny", prompt: { case: "text", value: "Hi" }, maxTokens: 1 });
const framingCases = (path: string, rpc: string) => [
  {
    name: `${rpc} with no message`,
    code: "invalid_request" as const,
    param: null,
    message: "The request has no message: send one acs.v1.CreateCompletionRequest.",
    cells: framedCells(new Uint8Array(0), path),
  },
  {
    name: `${rpc} with two messages`,
    code: "invalid_request" as const,
    param: null,
    message: "The request has 2 messages: send exactly one acs.v1.CreateCompletionRequest.",
    cells: framedCells(Buffer.concat([frame(oneMessage), frame(oneMessage)]), path),
  },
  {
    name: `${rpc} with a frame cut short`,
    code: "invalid_request" as const,
    param: null,
    message:
      "The request body ends inside a message frame: each message is a 5-byte header (flags, length) and as many bytes as the length says.",
    cells: framedCells(frame(oneMessage).subarray(0, 8), path),
  },
];

const cases: Case[] = [
  {
    name: "malformed protobuf",
    code: "invalid_request",
    param: null,
    message:
      "The request body is not a valid protobuf encoding of acs.v1.CreateCompletionRequest: premature EOF.",
    cells: {
      rest: { notApplicable: "REST takes JSON only (malformed JSON is its own case)" },
      "connect-json": BINARY_ONLY,
      "connect-proto": rpcRequest("connect-proto", { proto: new Uint8Array([0x0a, 0xff]) }),
      "connect-stream": rpcRequest("connect-stream", { proto: new Uint8Array([0x0a, 0xff]) }),
      grpc: rpcRequest("grpc", { proto: new Uint8Array([0x0a, 0xff]) }),
      "grpc-web": rpcRequest("grpc-web", { proto: new Uint8Array([0x0a, 0xff]) }),
    },
  },
  {
    name: "malformed JSON",
    code: "invalid_request",
    param: null,
    message: "The request body is not valid JSON: expected a JSON value but found the end of the body.",
    cells: { rest: rest('{"model":'), ...jsonRpcCells('{"model":') },
  },
  {
    name: "an unknown field",
    code: "invalid_request",
    param: "apply_hooks",
    message: "Unrecognized request argument supplied: apply_hooks",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","max_tokens":1,"apply_hooks":"x"}'),
      ...jsonRpcCells('{"model":"tiny","text":"Hi","maxTokens":1,"apply_hooks":"x"}'),
    },
  },
  {
    name: "a lone surrogate in a string",
    code: "invalid_request",
    param: null,
    message:
      "The request body is not valid JSON: the escape \\ud800 at position 28 is a lone surrogate: a string holds Unicode characters only.",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi\\ud800","max_tokens":1}'),
      ...jsonRpcCells('{"model":"tiny","text":"Hi!!\\ud800","maxTokens":1}'),
    },
  },
  {
    name: "a type error",
    code: "invalid_request",
    param: "max_tokens",
    message: "Invalid type for 'max_tokens': expected a number.",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","max_tokens":true}'),
      ...jsonRpcCells('{"model":"tiny","text":"Hi","maxTokens":true}'),
    },
  },
  {
    name: "a type error in a nested message",
    code: "invalid_request",
    param: "stream_options.include_usage",
    message: "Invalid type for 'stream_options.include_usage': expected a boolean.",
    cells: {
      rest: rest(
        '{"model":"tiny","prompt":"Hi","max_tokens":1,"stream":true,"stream_options":{"include_usage":1}}',
      ),
      ...jsonRpcCells('{"model":"tiny","text":"Hi","maxTokens":1,"streamOptions":{"includeUsage":1}}'),
    },
  },
  {
    // proto/API.md §3, order of checks: field types, then ranges. priority comes first in the body
    // and is out of int32, but max_tokens's wrong type is what the caller hears of first.
    name: "a type error after an integer out of range (types before ranges)",
    code: "invalid_request",
    param: "max_tokens",
    message: "Invalid type for 'max_tokens': expected a number.",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","priority":2147483648,"max_tokens":true}'),
      ...jsonRpcCells('{"model":"tiny","text":"Hi","priority":2147483648,"maxTokens":true}'),
    },
  },
  {
    name: "a type error after an int64 out of range (types before ranges)",
    code: "invalid_request",
    param: "echo",
    message: "Invalid type for 'echo': expected a boolean.",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","max_tokens":1,"seed":1e30,"echo":1}'),
      ...jsonRpcCells('{"model":"tiny","text":"Hi","maxTokens":1,"seed":1e30,"echo":1}'),
    },
  },
  {
    name: "an integer out of range, with no type error",
    code: "invalid_request",
    param: "priority",
    message: "Invalid value for 'priority': expected an integer from -2147483648 to 2147483647 (int32).",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","priority":2147483648,"max_tokens":1}'),
      ...jsonRpcCells('{"model":"tiny","text":"Hi","priority":2147483648,"maxTokens":1}'),
    },
  },
  {
    name: "REST's request sent to Connect (prompt is text/texts/token_ids there)",
    code: "invalid_request",
    param: "prompt",
    message: "Unrecognized request argument supplied: prompt",
    cells: {
      rest: { notApplicable: "REST's own request" },
      ...jsonRpcCells('{"model":"tiny","prompt":"Hi","max_tokens":1}'),
    },
  },
  {
    name: "a wrong Content-Type",
    code: "unsupported_media_type",
    param: null,
    message: contentTypeMessage,
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","max_tokens":1}', { "content-type": "text/plain" }),
      "connect-json": { path: UNARY, headers: { "content-type": "text/plain" }, body: "{}" },
      "connect-proto": {
        path: UNARY,
        headers: { "content-type": "application/x-protobuf" },
        body: new Uint8Array(0),
      },
      "connect-stream": {
        path: STREAM,
        headers: { "content-type": "application/connect+cbor" },
        body: frame(new Uint8Array(0)),
      },
      grpc: {
        http2: true,
        path: UNARY,
        headers: { "content-type": "application/grpc+cbor" },
        body: frame(new Uint8Array(0)),
      },
      "grpc-web": {
        path: UNARY,
        headers: { "content-type": "application/grpc-web+cbor" },
        body: frame(new Uint8Array(0)),
      },
    },
  },
  {
    name: "no Content-Type",
    code: "unsupported_media_type",
    param: null,
    message: contentTypeMessage,
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","max_tokens":1}', {}),
      "connect-json": { path: UNARY, headers: {}, body: '{"model":"tiny","text":"Hi"}' },
      "connect-proto": { notApplicable: "without a Content-Type nothing says binary" },
      "connect-stream": { notApplicable: "the Content-Type is what names the streaming protocols" },
      grpc: { notApplicable: "the Content-Type is what names the streaming protocols" },
      "grpc-web": { notApplicable: "the Content-Type is what names the streaming protocols" },
    },
  },
  {
    name: "an unsupported compression",
    code: "unsupported_media_type",
    param: null,
    message:
      "Unsupported request compression 'zstd': send the body uncompressed (identity) or compressed with gzip, deflate or br.",
    cells: {
      rest: rest('{"model":"tiny","prompt":"Hi","max_tokens":1}', {
        "content-type": "application/json",
        "content-encoding": "zstd",
      }),
      "connect-json": rpcRequest("connect-json", { json: "{}" }, { "content-encoding": "zstd" }),
      "connect-proto": rpcRequest(
        "connect-proto",
        { proto: new Uint8Array(0) },
        { "content-encoding": "zstd" },
      ),
      "connect-stream": rpcRequest(
        "connect-stream",
        { proto: new Uint8Array(0) },
        { "connect-content-encoding": "zstd" },
      ),
      grpc: rpcRequest("grpc", { proto: new Uint8Array(0) }, { "grpc-encoding": "zstd" }),
      "grpc-web": rpcRequest("grpc-web", { proto: new Uint8Array(0) }, { "grpc-encoding": "zstd" }),
    },
  },
  {
    name: "GET of a method with side effects",
    code: "method_not_allowed",
    param: null,
    message: (_surface, req) => `Method GET is not allowed on ${req.path.split("?")[0]}; use POST.`,
    cells: {
      rest: { method: "GET", path: "/v1/completions" },
      "connect-json": { method: "GET", path: `${UNARY}?encoding=json&message=${encodeURIComponent("{}")}` },
      "connect-proto": { method: "GET", path: `${UNARY}?encoding=proto&base64=1&message=` },
      "connect-stream": { notApplicable: "Connect GET is unary only" },
      grpc: { http2: true, method: "GET", path: UNARY, headers: { "content-type": "application/grpc" } },
      "grpc-web": { method: "GET", path: UNARY, headers: { "content-type": "application/grpc-web+proto" } },
    },
    also: (surface, metadata) => {
      if (surface === "rest" || surface.startsWith("connect")) expect(metadata.get("allow")).toBe("POST");
    },
  },
  {
    name: "a body over 8 MiB without Content-Length",
    code: "request_too_large",
    param: null,
    message: "The request body is too large: at most 8388608 bytes (8 MiB).",
    cells: {
      rest: {
        path: "/v1/completions",
        headers: { "content-type": "application/json" },
        chunks: oversize(new TextEncoder().encode('{"model":"tiny","prompt":"')),
      },
      "connect-json": {
        path: UNARY,
        headers: { "content-type": "application/json" },
        chunks: oversize(new TextEncoder().encode('{"model":"tiny","text":"')),
      },
      "connect-proto": {
        path: UNARY,
        headers: { "content-type": "application/proto" },
        chunks: chunksOf(bigProto),
      },
      "connect-stream": {
        path: STREAM,
        headers: { "content-type": "application/connect+proto" },
        chunks: chunksOf(frame(bigProto)),
      },
      grpc: {
        http2: true,
        path: UNARY,
        headers: { "content-type": "application/grpc" },
        chunks: chunksOf(frame(bigProto)),
      },
      "grpc-web": {
        path: UNARY,
        headers: { "content-type": "application/grpc-web+proto" },
        chunks: chunksOf(frame(bigProto)),
      },
    },
  },
  {
    name: "an unknown method",
    code: "unknown_route",
    param: null,
    message: (_surface, req) => `Invalid URL (POST ${req.path})`,
    cells: {
      rest: { path: "/v1/nope", headers: { "content-type": "application/json" }, body: "{}" },
      "connect-json": {
        path: "/acs.v1.CompletionsService/Nope",
        headers: { "content-type": "application/json" },
        body: "{}",
      },
      "connect-proto": {
        path: "/acs.v1.CompletionsService/Nope",
        headers: { "content-type": "application/proto" },
        body: "",
      },
      "connect-stream": {
        path: "/acs.v1.Nope/Stream",
        headers: { "content-type": "application/connect+proto" },
        body: frame(new Uint8Array(0)),
      },
      grpc: {
        http2: true,
        path: "/acs.v1.CompletionsService/Nope",
        headers: { "content-type": "application/grpc" },
        body: frame(new Uint8Array(0)),
      },
      "grpc-web": {
        path: "/acs.v1.CompletionsService/Nope",
        headers: { "content-type": "application/grpc-web+proto" },
        body: frame(new Uint8Array(0)),
      },
    },
  },
  {
    name: "a malformed timeout header",
    code: "invalid_request",
    param: null,
    message: (surface) =>
      surface === "grpc" || surface === "grpc-web"
        ? "Invalid grpc-timeout header 'soon': send at most 8 digits and a unit (H, M, S, m, u or n), e.g. 800m."
        : "Invalid connect-timeout-ms header 'soon': send a whole number of milliseconds, at most 10 digits.",
    cells: {
      rest: { notApplicable: "REST has no deadline header" },
      "connect-json": rpcRequest("connect-json", { json: "{}" }, { "connect-timeout-ms": "soon" }),
      "connect-proto": rpcRequest(
        "connect-proto",
        { proto: new Uint8Array(0) },
        { "connect-timeout-ms": "soon" },
      ),
      "connect-stream": rpcRequest(
        "connect-stream",
        { proto: new Uint8Array(0) },
        { "connect-timeout-ms": "soon" },
      ),
      grpc: rpcRequest("grpc", { proto: new Uint8Array(0) }, { "grpc-timeout": "soon" }),
      "grpc-web": rpcRequest("grpc-web", { proto: new Uint8Array(0) }, { "grpc-timeout": "soon" }),
    },
  },
  {
    name: "the caller's deadline passes",
    code: "deadline_exceeded",
    param: null,
    message: "The deadline the caller set (800 ms) passed before the request finished.",
    cells: {
      rest: {
        notApplicable: "REST has no deadline header (its own 14-minute wait is test/integration/faults)",
      },
      "connect-json": allRpcCells({}, { "connect-timeout-ms": "800" })["connect-json"],
      "connect-proto": allRpcCells({}, { "connect-timeout-ms": "800" })["connect-proto"],
      "connect-stream": allRpcCells({}, { "connect-timeout-ms": "800" })["connect-stream"],
      grpc: allRpcCells({}, { "grpc-timeout": "800m" }).grpc,
      "grpc-web": allRpcCells({}, { "grpc-timeout": "800m" })["grpc-web"],
    },
  },
  ...framingCases(UNARY, "CreateCompletion"),
  ...framingCases(STREAM, "StreamCompletion"),
];

/** The Connect code string (`invalid_argument`) of a catalogue code. */
const connectCodeString = (code: ErrorCode): string => codeToString(errorCatalogue[code].connectCode);

describe.each(cases)("$name", (c) => {
  const applicable = surfaces.filter((s) => !("notApplicable" in c.cells[s]));

  it.each(applicable)("%s answers with the envelope", async (surface) => {
    const req = c.cells[surface] as WireRequest;
    const res = await exchange(stack.url, req);
    const error = decodeError(formOf[surface], res);
    const kind = errorCatalogue[c.code];
    const expected = typeof c.message === "function" ? c.message(surface, req) : c.message;

    expect(error.envelope.code).toBe(c.code);
    expect(error.envelope.param).toBe(c.param);
    expect(error.envelope.type).toBe(kind.type);
    if (typeof expected === "string") expect(error.envelope.message).toBe(expected);
    else expect(error.envelope.message).toMatch(expected);
    // The protocol's own message is the envelope's.
    expect(error.protocolMessage).toBe(error.envelope.message);
    // One request id: the envelope's is the X-Request-Id header.
    expect(error.envelope.requestId).toMatch(/^req_[0-9a-f]{32}$/);
    expect(error.envelope.requestId).toBe(error.requestIdHeader);
    // The catalogue's status and code in each protocol's terms.
    switch (formOf[surface]) {
      case "rest":
        expect(error.httpStatus).toBe(kind.status);
        // The answer is what /openapi.json documents for it.
        expect(
          conformanceProblems({
            method: req.method ?? "POST",
            url: new URL(req.path, stack.url).href,
            status: res.status,
            headers: res.headers,
            body: res.body.toString("utf8"),
            complete: true,
          }),
        ).toStrictEqual([]);
        break;
      case "connect":
        expect(error.httpStatus).toBe(kind.status);
        expect(error.protocolCode).toBe(connectCodeString(c.code));
        break;
      case "connect-stream":
        expect(error.httpStatus).toBe(200);
        expect(error.protocolCode).toBe(connectCodeString(c.code));
        break;
      case "grpc":
      case "grpc-web":
        expect(error.httpStatus).toBe(200);
        expect(error.protocolCode).toBe(kind.connectCode);
        break;
    }
    c.also?.(surface, error.metadata);
  });

  if (typeof c.message !== "function") {
    it("is the same error on every surface", async () => {
      const seen = await Promise.all(
        applicable.map(async (s) => {
          const e = decodeError(formOf[s], await exchange(stack.url, c.cells[s] as WireRequest)).envelope;
          return JSON.stringify({ code: e.code, message: e.message, param: e.param, type: e.type });
        }),
      );
      expect(new Set(seen).size).toBe(1);
    });
  }
});

describe("around the table", () => {
  it("an unknown method is UNIMPLEMENTED on gRPC and Connect's 404 unimplemented", async () => {
    expect(errorCatalogue.unknown_route.connectCode).toBe(Code.Unimplemented);
    const res = await exchange(stack.url, {
      path: "/no.such.Service/Call",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(res.status).toBe(404);
    expect(decodeError("connect", res).protocolCode).toBe("unimplemented");
  });

  it("Connect JSON takes the proto field names too (max_tokens as well as maxTokens)", async () => {
    const res = await exchange(stack.url, {
      path: UNARY,
      headers: { "content-type": "application/json", "connect-timeout-ms": "300" },
      body: '{"model":"tiny","text":"Hi","max_tokens":1}',
    });
    // Accepted: the request reaches Inference (which never answers here), so the deadline ends it.
    expect(decodeError("connect", res).envelope.code).toBe("deadline_exceeded");
  });

  it("the same field under both names is refused", async () => {
    const res = await exchange(stack.url, {
      path: UNARY,
      headers: { "content-type": "application/json" },
      body: '{"model":"tiny","text":"Hi","max_tokens":1,"maxTokens":2}',
    });
    const error = decodeError("connect", res);
    expect(error.envelope).toMatchObject({
      code: "invalid_request",
      param: "max_tokens",
      message: "'max_tokens' is set twice: as 'max_tokens' and as 'maxTokens'.",
    });
  });

  it("each deadline aborted its Inference request", async () => {
    const completions = upstream.requests.filter((r) => r.url === "/v1/completions");
    expect(completions.length).toBeGreaterThanOrEqual(6);
    for (const r of completions) expect((await r.closed).aborted).toBe(true);
  });
});
