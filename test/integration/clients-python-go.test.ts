// Generated clients in other languages against a real gateway (reference engine, llama-8b shape):
// the Python (grpcio) client test/clients/python/client.py and the Go (grpc-go) client
// test/clients/go/main.go, on code from `npm run generate:clients`. Each calls the three RPCs,
// reads a stream, cancels one, reads the ErrorEnvelope detail of a refusal and receives a capture
// larger than gRPC's default 4 MiB; their reports are compared with the gateway's REST answers.
//
// Needs Debian's python3-grpcio, python3-protobuf, protobuf-compiler, protobuf-compiler-grpc,
// golang, golang-google-grpc-dev, golang-google-protobuf-dev, golang-github-golang-protobuf-1-5-dev,
// protoc-gen-go and protoc-gen-go-grpc, so it runs only with ACS_CLIENT_TESTS=1 (.ci/run installs
// them and sets it). ACS_CLIENTS_DIR names generated clients to use; without it they are generated
// into a temporary directory.
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const run = promisify(execFile);
const enabled = process.env.ACS_CLIENT_TESTS === "1";
const root = join(import.meta.dirname, "..", "..");

/** What a client saw (both clients print the same shape; status codes as gRPC numbers). */
interface Report {
  list_models: Array<{
    id: string;
    aliases: string[];
    max_model_len: number;
    hidden_size: number;
    num_hidden_layers: number;
  }>;
  create: {
    id: string;
    model: string;
    text: string;
    finish_reason: string;
    completion_tokens: number;
    x_request_id: string;
  };
  stream: { text: string; chunks: number; finish_reasons: string[]; usage_total: number };
  cancel: { chunks_read: number; code: number };
  error: {
    code: number;
    details: string;
    x_request_id: string;
    envelope: {
      message: string;
      type: string;
      param: string | null;
      code: string | null;
      request_id: string;
    };
  };
  capture: { shape: number[]; dtype: string; compression: string; bytes: number; sha256: string };
}

/** The REST answers the clients' reports must match (same requests, same stack). */
interface Expected {
  text: string;
  totalTokens: number;
  error: { message: string; type: string; param: string | null; code: string | null };
  capturePromptTokens: number;
  captureSha256: string;
}

const grpcCanceled = 1;
const grpcInvalidArgument = 3;

describe.skipIf(!enabled)(
  "generated Python (grpcio) and Go clients against a real gateway (runs only with ACS_CLIENT_TESTS=1)",
  () => {
    let stack: Stack;
    let work: string;
    let clientsDir: string;
    let goClient: string;
    let expected: Expected;

    async function rest(body: Record<string, unknown>): Promise<{ status: number; json: unknown }> {
      const res = await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "llama-8b", ...body }),
      });
      return { status: res.status, json: await res.json() };
    }

    beforeAll(async () => {
      work = mkdtempSync(join(tmpdir(), "acs-clients-"));
      clientsDir = process.env.ACS_CLIENTS_DIR ?? join(work, "clients");
      if (process.env.ACS_CLIENTS_DIR === undefined) {
        await run(process.execPath, ["--import", "tsx", "proto-vendor/generate-clients.ts", clientsDir], {
          cwd: root,
        });
      }
      goClient = join(work, "go-client");
      await run("go", ["build", "-o", goClient, "test/clients/go/main.go"], {
        cwd: root,
        env: {
          ...process.env,
          GOPATH: `${join(clientsDir, "go")}:${process.env.GOPATH ?? "/usr/share/gocode"}`,
          GO111MODULE: "off",
          GOFLAGS: "",
          // go needs a build cache; without HOME it has no default
          ...(process.env.HOME || process.env.GOCACHE ? {} : { GOCACHE: join(work, "go-cache") }),
        },
      });

      stack = await startStack({ preset: "llama-8b" });
      const greedy = { prompt: "The sky is", max_tokens: 5, temperature: 0, ignore_eos: true };
      const ok = (await rest(greedy)).json as {
        choices: Array<{ text: string }>;
        usage: { total_tokens: number };
      };
      const refused = await rest({ prompt: "x", n: 2, max_tokens: 16001 });
      expect(refused.status).toBe(400);
      const capture = await rest({
        prompt: "The quick brown fox jumps over the lazy dog. ".repeat(6),
        max_tokens: 2,
        temperature: 0,
        ignore_eos: true,
        output_residual_stream: true,
      });
      const captured = capture.json as {
        usage: { prompt_tokens: number };
        activations: { residual_stream: { data: string } };
      };
      expected = {
        text: ok.choices[0]?.text ?? "",
        totalTokens: ok.usage.total_tokens,
        error: (refused.json as { error: Expected["error"] }).error,
        capturePromptTokens: captured.usage.prompt_tokens,
        captureSha256: createHash("sha256")
          .update(Buffer.from(captured.activations.residual_stream.data, "base64"))
          .digest("hex"),
      };
    }, 300_000);

    afterAll(async () => {
      await stack?.close();
      rmSync(work, { recursive: true, force: true });
    });

    async function check(command: string, args: string[], env: Record<string, string>): Promise<void> {
      const aborted = stack.engine?.stats.aborted ?? 0;
      const { stdout } = await run(command, [...args, stack.url, "llama-8b"], {
        cwd: root,
        env: { ...process.env, ...env },
        maxBuffer: 16 * 1024 * 1024,
      });
      const report = JSON.parse(stdout) as Report;

      expect(report.list_models).toEqual([
        {
          id: stack.modelId,
          aliases: ["llama-8b"],
          max_model_len: stack.engine?.model.maxModelLen,
          hidden_size: 4096,
          num_hidden_layers: 32,
        },
      ]);

      expect(report.create.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
      expect(report.create.model).toBe("llama-8b");
      expect(report.create.text).toBe(expected.text);
      expect(report.create.finish_reason).toBe("FINISH_REASON_LENGTH");
      expect(report.create.completion_tokens).toBe(5);
      expect(report.create.x_request_id).toMatch(/^req_[0-9a-f]{32}$/);

      expect(report.stream.text).toBe(expected.text);
      expect(report.stream.chunks).toBeGreaterThan(1);
      expect(report.stream.finish_reasons).toEqual(["FINISH_REASON_LENGTH"]);
      expect(report.stream.usage_total).toBe(expected.totalTokens);

      // The client cancelled after two chunks of a 1000-token stream: the gateway aborted the
      // Inference request (the only one of the run that ends early).
      expect(report.cancel).toEqual({ chunks_read: 2, code: grpcCanceled });
      await until(() => stack.engine?.stats.aborted === aborted + 1, "the engine saw the abort");
      expect(stack.engine?.stats.aborted).toBe(aborted + 1);

      expect(report.error.code).toBe(grpcInvalidArgument);
      expect(report.error.details).toBe(expected.error.message);
      expect(report.error.envelope).toEqual({ ...expected.error, request_id: report.error.x_request_id });
      expect(report.error.x_request_id).toMatch(/^req_[0-9a-f]{32}$/);

      // Larger than gRPC's default 4 MiB receive limit: arrives only because the client raised it.
      expect(report.capture.bytes).toBeGreaterThan(4 * 1024 * 1024);
      expect(report.capture).toMatchObject({
        shape: [32, expected.capturePromptTokens + 2 - 1, 4096],
        dtype: "DTYPE_BFLOAT16",
        compression: "COMPRESSION_ZSTD",
        sha256: expected.captureSha256,
      });
    }

    it("Python: ListModels, CreateCompletion, a stream, a cancelled stream, the ErrorEnvelope detail, a capture over 4 MiB", async () => {
      await check("/usr/bin/python3", ["test/clients/python/client.py"], {
        PYTHONPATH: join(clientsDir, "python"),
      });
    });

    it("Go: ListModels, CreateCompletion, a stream, a cancelled stream, the ErrorEnvelope detail, a capture over 4 MiB", async () => {
      await check(goClient, [], {});
    });
  },
);
