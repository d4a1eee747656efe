// The behaviours of connect-es (pinned version) that the error envelopes rely on, each named, so
// that an upgrade that changes one fails here rather than in the envelopes' answers:
// 1. a ConnectError thrown by `jsonOptions.textDecoder` is the error connect-es writes, as it is
//    (code, message, details), on Connect unary, Connect streaming, gRPC and gRPC-Web: how our
//    strict decoder carries its refusal (src/surfaces/rpc/carried-refusal.ts);
// 2. what connect-es writes keeps no `cause`: an Error thrown by the text decoder arrives as
//    InvalidArgument with its message only, and a binary message protobuf-es refuses as Internal
//    `parse binary: …` with no cause — why a refusal is carried in a detail, and why a body that
//    may need explaining from its bytes (binary, framed, compressed) is still kept;
// 3. interceptors run only once the request message is parsed (a unary call): what
//    `releaseParsedBody` (src/surfaces/rpc/request-body.ts) relies on to drop the kept body.
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createConnectRouter, createContextValues } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerResponse } from "@connectrpc/connect/protocol";
import { endStreamFromJson, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { describe, expect, it } from "vitest";
import {
  CompletionsService,
  TokenizeRequestSchema,
  TokenizeResponseSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../../gen/acs/v1/error_pb.js";
import { ApiError } from "../../../src/core/errors/index.js";
import { toConnectError } from "../../../src/surfaces/rpc/index.js";
import { frame, frames } from "../../helpers/rpc-wire.js";

const tokenize = CompletionsService.method.tokenize;
const streamCompletion = CompletionsService.method.streamCompletion;

/** The error our decoder would carry: an envelope with no request id yet. */
const carried = () =>
  toConnectError(new ApiError("invalid_request", "Bad JSON here.", { param: "text" }), "");

/** The one universal handler of `method`, its JSON read by `decode`; `seen` counts interceptor runs. */
function handlerOf(
  method: typeof tokenize | typeof streamCompletion,
  decode: (bytes: Uint8Array) => string,
  seen: { interceptor: number } = { interceptor: 0 },
): UniversalHandler {
  const router = createConnectRouter({
    interceptors: [
      (next) => (req) => {
        seen.interceptor++;
        return next(req);
      },
    ],
  });
  const jsonOptions = { textDecoder: { decode } } as never;
  if (method === tokenize) {
    router.rpc(tokenize, () => create(TokenizeResponseSchema), { jsonOptions });
  } else {
    router.rpc(
      streamCompletion,
      async function* () {
        yield* [];
      },
      { jsonOptions },
    );
  }
  return router.handlers[0] as UniversalHandler;
}

async function call(
  handler: UniversalHandler,
  contentType: string,
  body: Uint8Array,
): Promise<{ res: UniversalServerResponse; body: Buffer }> {
  const res = await handler({
    httpVersion: "2.0",
    method: "POST",
    url: `http://x${handler.requestPath}`,
    header: new Headers({ "content-type": contentType }),
    body: (async function* () {
      yield body;
    })(),
    signal: new AbortController().signal,
    contextValues: createContextValues(),
  });
  const chunks: Uint8Array[] = [];
  for await (const c of res.body ?? []) chunks.push(c);
  return { res, body: Buffer.concat(chunks) };
}

const json = new TextEncoder().encode('{"prompt":"a"}');

/** The error each protocol wrote, read back as a caller reads it. */
const readers: Record<
  string,
  (out: { res: UniversalServerResponse; body: Buffer }) => ConnectError | undefined
> = {
  "application/json": (out) => errorFromJsonBytes(out.body, undefined, new ConnectError("none")),
  "application/connect+json": (out) =>
    endStreamFromJson(frames(out.body).at(-1)?.data ?? new Uint8Array()).error,
  "application/grpc+json": (out) => findTrailerError(out.res.trailer ?? new Headers()),
  "application/grpc-web+json": (out) =>
    findTrailerError(trailerParse(frames(out.body).at(-1)?.data ?? new Uint8Array())),
};

describe("1. a ConnectError thrown by jsonOptions.textDecoder is written as it is", () => {
  it.each(Object.keys(readers))("%s", async (type) => {
    const method = type === "application/connect+json" ? streamCompletion : tokenize;
    const handler = handlerOf(method, () => {
      throw carried();
    });
    const err = readers[type]?.(await call(handler, type, type === "application/json" ? json : frame(json)));
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toBe("Bad JSON here.");
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0];
    expect(envelope?.requestId).toBe("");
    expect(envelope?.error?.param).toBe("text");
  });
});

describe("2. what connect-es writes keeps no cause", () => {
  it("an Error of the text decoder: InvalidArgument, its message, no detail", async () => {
    const handler = handlerOf(tokenize, () => {
      throw new ApiError("invalid_request", "Bad JSON here.");
    });
    const err = readers["application/json"]?.(await call(handler, "application/json", json));
    expect(err?.code).toBe(Code.InvalidArgument);
    expect(err?.rawMessage).toBe("Bad JSON here.");
    expect(err?.details).toEqual([]);
    expect(err?.cause).toBeUndefined();
  });

  it("a binary message protobuf-es refuses: Internal `parse binary: …`, no cause", async () => {
    const handler = handlerOf(tokenize, () => "{}");
    const out = await call(handler, "application/proto", new Uint8Array([0x0a, 0xff, 0xff, 0xff]));
    const err = errorFromJsonBytes(out.body, undefined, new ConnectError("none"));
    expect(err.code).toBe(Code.Internal);
    expect(err.rawMessage).toMatch(/^parse binary: /);
    expect(err.cause).toBeUndefined();
  });
});

describe("3. interceptors run once the request message is parsed", () => {
  it("a unary message the decoder refuses runs no interceptor; one it reads, after decoding", async () => {
    const seen = { interceptor: 0 };
    const refusing = handlerOf(
      tokenize,
      () => {
        throw carried();
      },
      seen,
    );
    await call(refusing, "application/json", json);
    expect(seen.interceptor).toBe(0);
    const order: string[] = [];
    const reading = handlerOf(
      tokenize,
      (bytes) => {
        order.push(`decode (interceptor ran ${seen.interceptor})`);
        return new TextDecoder().decode(bytes);
      },
      seen,
    );
    await call(reading, "application/proto", toBinary(TokenizeRequestSchema, create(TokenizeRequestSchema)));
    await call(reading, "application/json", json);
    expect(order).toEqual(["decode (interceptor ran 1)"]);
    expect(seen.interceptor).toBe(2);
  });
});
