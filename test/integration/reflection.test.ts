// gRPC server reflection on the gateway's one port: `buf curl` (a Go client, independent of
// connect-es) lists and calls the API from reflection alone, over v1 and v1alpha.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Stack, startStack } from "../helpers/start-stack.js";

const run = promisify(execFile);
let stack: Stack;

beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});

async function bufCurl(args: string[]) {
  return run("node_modules/.bin/buf", ["curl", "--http2-prior-knowledge", ...args], { timeout: 30_000 }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({
      code: e.code,
      stdout: e.stdout,
      stderr: e.stderr,
    }),
  );
}

describe.each(["grpc-v1", "grpc-v1alpha"])("reflection %s", (reflectProtocol) => {
  it("buf curl --list-methods lists every method served", async () => {
    const r = await bufCurl(["--reflect-protocol", reflectProtocol, "--list-methods", stack.url]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trim().split("\n").sort()).toEqual([
      "acs.v1.AdminService/CreateKey",
      "acs.v1.AdminService/GetKey",
      "acs.v1.AdminService/ListAuditLogs",
      "acs.v1.AdminService/ListKeys",
      "acs.v1.AdminService/RevokeKey",
      "acs.v1.AdminService/RotateKey",
      "acs.v1.AdminService/UpdateKey",
      "acs.v1.CompletionsService/CreateCompletion",
      "acs.v1.CompletionsService/Detokenize",
      "acs.v1.CompletionsService/ListModels",
      "acs.v1.CompletionsService/StreamCompletion",
      "acs.v1.CompletionsService/Tokenize",
      "grpc.health.v1.Health/Check",
      "grpc.health.v1.Health/List",
      "grpc.health.v1.Health/Watch",
      "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
      "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ]);
  });

  it("buf curl calls CreateCompletion with the schema from reflection (no .proto files)", async () => {
    const body = JSON.stringify({ model: "tiny", text: "The sky is", max_tokens: 3, temperature: 0 });
    const r = await bufCurl([
      "--reflect-protocol",
      reflectProtocol,
      "-d",
      body,
      `${stack.url}/acs.v1.CompletionsService/CreateCompletion`,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const res = JSON.parse(r.stdout) as { id: string; usage: { completionTokens: number } };
    expect(res.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(res.usage.completionTokens).toBe(3);
  });
});

it("reflection without HTTP/2 is refused in the protocol's form, with the envelope", async () => {
  // A bidirectional stream cannot run over HTTP/1.1 (gRPC-Web): a clear error, not a hang.
  const res = await fetch(`${stack.url}/grpc.reflection.v1.ServerReflection/ServerReflectionInfo`, {
    method: "POST",
    headers: { "content-type": "application/grpc-web+proto" },
    body: new Uint8Array([0, 0, 0, 0, 0]),
  });
  expect(res.status).toBe(200);
  const text = Buffer.from(await res.arrayBuffer()).toString("latin1");
  expect(text).toContain("grpc-status: 12");
  expect(decodeURIComponent(/grpc-message: (.*)\r\n/.exec(text)?.[1] ?? "")).toMatch(
    /bidirectional stream: call it with gRPC over HTTP\/2/,
  );
  expect(text).toContain("grpc-status-details-bin");
});
