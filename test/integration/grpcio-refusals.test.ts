// gRPC C-core (Python grpcio) reads every refusal as a gRPC status with our ErrorEnvelope trailer:
// an unknown method is UNIMPLEMENTED (it used to get an HTTP 404 with a JSON body, which grpcio
// logged as a content-type error), a malformed message INVALID_ARGUMENT, a message over 8 MiB
// sent without Content-Length RESOURCE_EXHAUSTED. Runs where /usr/bin/python3 has grpcio (Debian
// python3-grpcio); skipped elsewhere.
import { execFile, execFileSync } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, expect, it } from "vitest";
import { type Stack, startStack } from "../helpers/start-stack.js";

const run = promisify(execFile);
const python = "/usr/bin/python3";
const hasGrpcio = (() => {
  try {
    execFileSync(python, ["-c", "import grpc"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();

let stack: Stack;
beforeAll(async () => {
  if (hasGrpcio) stack = await startStack();
});
afterAll(async () => {
  await stack?.close();
});

it.skipIf(!hasGrpcio)("grpcio reads each refusal as its gRPC status, with the envelope", async () => {
  const script = join(import.meta.dirname, "..", "clients", "python", "refusals.py");
  const { stdout, stderr } = await run(python, [script, new URL(stack.url).host], { timeout: 60_000 });
  const report = JSON.parse(stdout) as Record<
    string,
    { code: string; details: string; details_bin: boolean }
  >;
  expect(report.unknown_method).toEqual({
    code: "UNIMPLEMENTED",
    details: "Invalid URL (POST /acs.v1.CompletionsService/Nope)",
    details_bin: true,
  });
  expect(report.unknown_service).toMatchObject({ code: "UNIMPLEMENTED", details_bin: true });
  expect(report.malformed).toEqual({
    code: "INVALID_ARGUMENT",
    details:
      "The request body is not a valid protobuf encoding of acs.v1.CreateCompletionRequest: premature EOF.",
    details_bin: true,
  });
  expect(report.oversize).toEqual({
    code: "RESOURCE_EXHAUSTED",
    details: "The request body is too large: at most 8388608 bytes (8 MiB).",
    details_bin: true,
  });
  // No "content-type" complaints from C-core about our answers.
  expect(stderr).not.toMatch(/content-type/i);
});
