// `buf curl` (a Go client, independent of connect-es) over gRPC h2c, Connect and gRPC-Web.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HANG_GUARD_MS } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const run = promisify(execFile);
let stack: Stack;

beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});

async function bufCurl(protocol: string, method: string, body: object) {
  const args = ["curl", "--schema", ".", "--protocol", protocol, "-d", JSON.stringify(body)];
  if (protocol === "grpc") args.push("--http2-prior-knowledge");
  args.push(`${stack.url}/acs.v1.CompletionsService/${method}`);
  return run("node_modules/.bin/buf", args, { timeout: HANG_GUARD_MS }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({
      code: e.code,
      stdout: e.stdout,
      stderr: e.stderr,
    }),
  );
}

describe.each(["grpc", "connect", "grpcweb"])("buf curl --protocol %s", (protocol) => {
  it("CreateCompletion", async () => {
    const r = await bufCurl(protocol, "CreateCompletion", {
      model: "tiny",
      text: "The sky is",
      max_tokens: 4,
      temperature: 0,
    });
    expect(r.code, r.stderr).toBe(0);
    const res = JSON.parse(r.stdout) as {
      id: string;
      choices: Array<{ finishReason: string }>;
      usage: { completionTokens: number };
    };
    expect(res.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(res.usage.completionTokens).toBeGreaterThan(0);
  });

  it("an error carries the acs.v1.ErrorEnvelope detail", async () => {
    const r = await bufCurl(protocol, "CreateCompletion", { model: "nope", text: "x" });
    expect(r.code).not.toBe(0);
    const err = JSON.parse(r.stderr) as { code: string; message: string; details: Array<{ type: string }> };
    expect(err.code).toBe("not_found");
    expect(err.details.map((d) => d.type)).toEqual(["acs.v1.ErrorEnvelope"]);
  });
});
