// One rule for the Authorization header on every surface and both HTTP versions
// (parseAuthorization, proto/API.md §9): the scheme in any case, spaces or tabs between it and the
// key, whitespace around the value ignored. Over HTTP/2 a value that starts or ends with
// whitespace is one RFC 9113 calls malformed and nghttp2 drops unless told not to; the gateway
// tells it not to where Node can (`strictFieldWhitespaceValidation`), and this file checks that
// case only where the running Node delivers such a value.
import { mkdtempSync, rmSync } from "node:fs";
import http2 from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { exchange, frame, frames, type WireResponse } from "../helpers/rpc-wire.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let dir: string;
let key: string;
let h2KeepsFieldWhitespace = false;

/** Whether this Node's HTTP/2 server hands on a field value with a trailing space. */
async function probeFieldWhitespace(): Promise<boolean> {
  const server = http2.createServer(
    { strictFieldWhitespaceValidation: false } as http2.ServerOptions,
    (req, res) => res.end(String(req.headers["x-probe"] !== undefined)),
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  const session = http2.connect(`http://127.0.0.1:${port}`);
  const stream = session.request({ ":path": "/", "x-probe": "a " });
  let text = "";
  stream.on("data", (d: Buffer) => {
    text += d.toString();
  });
  await new Promise((resolve) => stream.on("end", resolve));
  session.close();
  await new Promise((resolve) => server.close(resolve));
  return text === "true";
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-auth-"));
  stack = await startStack({ dbPath: join(dir, "acs.db") });
  if (!stack.ledger) throw new Error("no ledger");
  key = (await stack.ledger.createKey({ budgetTokens: 100_000 })).key;
  h2KeepsFieldWhitespace = await probeFieldWhitespace();
});
afterAll(async () => {
  await stack.close();
  rmSync(dir, { recursive: true, force: true });
});

const json = JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 1 });
const connectJson = JSON.stringify({ model: "tiny", text: "Hi", maxTokens: 1 });
const proto = frame(
  toBinary(
    CreateCompletionRequestSchema,
    create(CreateCompletionRequestSchema, {
      model: "tiny",
      prompt: { case: "text", value: "Hi" },
      maxTokens: 1,
    }),
  ),
);
const rpc = "/acs.v1.CompletionsService/CreateCompletion";

interface Surface {
  readonly name: string;
  readonly http2: boolean;
  readonly path: string;
  readonly contentType: string;
  readonly body: string | Uint8Array;
  /** The call went through: a completion, not a refusal. */
  readonly ok: (res: WireResponse) => boolean;
}

const grpcWebStatus = (res: WireResponse): string | undefined => {
  const trailer = frames(res.body).find((f) => (f.flags & 0x80) !== 0);
  return /grpc-status: ?(\d+)/.exec(trailer?.data.toString("latin1") ?? "")?.[1];
};

const surfaces: Surface[] = [false, true].flatMap((h2) => [
  {
    name: `REST over HTTP/${h2 ? 2 : 1.1}`,
    http2: h2,
    path: "/v1/completions",
    contentType: "application/json",
    body: json,
    ok: (res: WireResponse) => res.status === 200,
  },
  {
    name: `Connect JSON over HTTP/${h2 ? 2 : 1.1}`,
    http2: h2,
    path: rpc,
    contentType: "application/json",
    body: connectJson,
    ok: (res: WireResponse) => res.status === 200,
  },
  h2
    ? {
        name: "gRPC over HTTP/2",
        http2: true,
        path: rpc,
        contentType: "application/grpc+proto",
        body: proto,
        ok: (res: WireResponse) =>
          (res.trailers.get("grpc-status") ?? res.headers.get("grpc-status")) === "0",
      }
    : {
        name: "gRPC-Web over HTTP/1.1",
        http2: false,
        path: rpc,
        contentType: "application/grpc-web+proto",
        body: proto,
        ok: (res: WireResponse) => res.status === 200 && grpcWebStatus(res) === "0",
      },
]);

async function call(s: Surface, authorization: string): Promise<WireResponse> {
  return exchange(stack.url, {
    http2: s.http2,
    path: s.path,
    headers: { "content-type": s.contentType, authorization },
    body: s.body,
  });
}

const show = (res: WireResponse) => `${res.status} ${res.body.toString("latin1").slice(0, 300)}`;

describe("the same Authorization values are accepted on every surface and protocol", () => {
  const inner = (k: string) => [`Bearer ${k}`, `bearer ${k}`, `BEARER   ${k}`, `Bearer\t${k}`];
  it.each(surfaces)("$name", async (s) => {
    for (const value of inner(key)) {
      const res = await call(s, value);
      expect(s.ok(res), `${JSON.stringify(value)}: ${show(res)}`).toBe(true);
    }
  });
});

describe("whitespace around the value is ignored", () => {
  const around = (k: string) => [`Bearer   ${k}   `, `  Bearer ${k}`, `\tBearer ${k}\t`];
  it.each(surfaces)("$name", async (s) => {
    // HTTP/1.1 strips it in Node's parser; HTTP/2 hands it on only where Node has the option.
    if (s.http2 && !h2KeepsFieldWhitespace) return;
    for (const value of around(key)) {
      const res = await call(s, value);
      expect(s.ok(res), `${JSON.stringify(value)}: ${show(res)}`).toBe(true);
    }
  });
});

describe("a key the store does not know is refused on every surface (the checks above are not vacuous)", () => {
  it.each(surfaces)("$name", async (s) => {
    const res = await call(s, `Bearer ${key.slice(0, -4)}xxxx`);
    expect(s.ok(res), show(res)).toBe(false);
  });
});
