// withErrorEnvelopes rewrites a bare end-of-stream error however the body is cut into chunks, and
// leaves the messages before it byte for byte; errors that carry the envelope pass unchanged.
import { fromBinary } from "@bufbuild/protobuf";
import { base64Decode } from "@bufbuild/protobuf/wire";
import { createConnectRouter, createContextValues } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerResponse } from "@connectrpc/connect/protocol";
import { describe, expect, it } from "vitest";
import { CompletionsService } from "../../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../../gen/acs/v1/error_pb.js";
import { requestIdKey, withErrorEnvelopes } from "../../../src/surfaces/rpc/index.js";
import { frame, frames } from "../../helpers/rpc-wire.js";

const method = CompletionsService.method.streamCompletion;
const requestId = "req_0123456789abcdef0123456789abcdef";

/** A universal handler that answers `response`, wrapped as the server wraps its handlers. */
function wrapped(response: () => UniversalServerResponse): UniversalHandler {
  const router = createConnectRouter();
  const fake = Object.assign(async () => response(), {
    service: CompletionsService,
    method,
    requestPath: "/acs.v1.CompletionsService/StreamCompletion",
    supportedContentType: () => true,
    protocolNames: ["connect"],
    allowedMethods: ["POST"],
  }) as unknown as UniversalHandler;
  withErrorEnvelopes((r) => r.handlers.push(fake), { readMaxBytes: 1024 })(router);
  return router.handlers[0] as UniversalHandler;
}

async function call(
  handler: UniversalHandler,
  contentType: string,
): Promise<{ res: UniversalServerResponse; body: Buffer }> {
  const res = await handler({
    httpVersion: "1.1",
    method: "POST",
    url: "http://x/acs.v1.CompletionsService/StreamCompletion",
    header: new Headers({ "content-type": contentType }),
    body: (async function* () {})(),
    signal: new AbortController().signal,
    contextValues: createContextValues().set(requestIdKey, requestId),
  });
  const chunks: Uint8Array[] = [];
  for await (const c of res.body ?? []) chunks.push(c);
  return { res, body: Buffer.concat(chunks) };
}

/** `bytes` cut at `cuts`. */
async function* cut(bytes: Uint8Array, cuts: number[]): AsyncGenerator<Uint8Array> {
  let from = 0;
  for (const at of [...cuts, bytes.byteLength]) {
    yield bytes.subarray(from, at);
    from = at;
  }
}

const message = frame(new TextEncoder().encode('{"text":"hello"}'));
const bareEnd = frame(
  new TextEncoder().encode('{"error":{"code":"resource_exhausted","message":"read limit"}}'),
  0b10,
);
const body = Buffer.concat([message, message, bareEnd]);

describe("Connect streaming: the end-stream frame", () => {
  it.each([
    ["one frame per chunk", [message.byteLength, 2 * message.byteLength]],
    ["a header cut in two", [3, message.byteLength + 2]],
    ["the end-stream frame cut in two", [2 * message.byteLength + 7]],
    ["every byte its own chunk", Array.from({ length: body.byteLength - 1 }, (_, i) => i + 1)],
    ["all in one chunk", []],
  ])("%s", async (_name, cuts) => {
    const handler = wrapped(() => ({ status: 200, header: new Headers(), body: cut(body, cuts) }));
    const { body: out } = await call(handler, "application/connect+json");
    const fs = frames(out);
    expect(fs.map((f) => f.flags)).toEqual([0, 0, 0b10]);
    expect(
      Buffer.concat([frame(fs[0]?.data ?? new Uint8Array()), frame(fs[1]?.data ?? new Uint8Array())]),
    ).toEqual(Buffer.concat([message, message]));
    const end = JSON.parse((fs[2]?.data ?? Buffer.alloc(0)).toString()) as {
      error: { code: string; message: string; details: { type: string; value: string }[] };
    };
    expect(end.error.code).toBe("resource_exhausted");
    expect(end.error.message).toBe("The request body is too large: at most 1024 bytes.");
    const detail = end.error.details.find((d) => d.type === "acs.v1.ErrorEnvelope");
    const envelope = fromBinary(ErrorEnvelopeSchema, base64Decode(detail?.value ?? ""));
    expect(envelope.error?.code).toBe("request_too_large");
    expect(envelope.requestId).toBe(requestId);
  });

  it("an end-stream without an error, or with the envelope already, is kept byte for byte", async () => {
    const ok = Buffer.concat([message, frame(new TextEncoder().encode("{}"), 0b10)]);
    const handler = wrapped(() => ({ status: 200, header: new Headers(), body: cut(ok, [4]) }));
    expect((await call(handler, "application/connect+json")).body).toEqual(ok);
  });
});

describe("gRPC-Web: the trailer frame", () => {
  it("is rewritten when cut across chunks", async () => {
    const trailer = frame(new TextEncoder().encode("grpc-status: 8\r\ngrpc-message: read%20limit\r\n"), 0x80);
    const all = Buffer.concat([message, trailer]);
    const handler = wrapped(() => ({
      status: 200,
      header: new Headers(),
      body: cut(all, [message.byteLength + 3]),
    }));
    const { body: out } = await call(handler, "application/grpc-web+json");
    const fs = frames(out);
    expect(fs.map((f) => f.flags)).toEqual([0, 0x80]);
    const text = fs[1]?.data.toString() ?? "";
    expect(text).toContain("grpc-status: 8");
    expect(text).toContain("grpc-status-details-bin: ");
  });
});

describe("gRPC: the trailers", () => {
  it("get the envelope once the body has ended", async () => {
    const trailer = new Headers({ "grpc-status": "4", "grpc-message": "the operation timed out" });
    const handler = wrapped(() => ({
      status: 200,
      header: new Headers(),
      body: cut(message, [2]) as never,
      trailer,
    }));
    const { res, body: out } = await call(handler, "application/grpc+json");
    expect(out).toEqual(Buffer.from(message));
    expect(res.trailer?.get("grpc-status")).toBe("4");
    expect(decodeURIComponent(res.trailer?.get("grpc-message") ?? "")).toBe(
      "The deadline the caller set passed before the request finished.",
    );
    expect(res.trailer?.get("grpc-status-details-bin")).toBeTruthy();
  });
});
