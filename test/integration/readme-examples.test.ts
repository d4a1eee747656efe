// The examples for newcomers (once the README's), extracted from proto/EXAMPLES.md (each fenced block
// after an `<!-- example: NAME -->` marker, test/helpers/readme-examples.ts) and run against a real gateway
// and the reference engine (llama-8b shape): curl's streaming, steering and capture requests, the
// TypeScript and Python tensor decoders (checked against the independent decoder of
// test/helpers/decode-tensor.ts), the Python openai SDK with `extra_body`, a Python gRPC client in a
// venv over Debian's grpcio, and a Go program built in module mode.
//
// What needs system packages is gated, saying why when skipped:
// - the Python decoder: /usr/bin/python3 with numpy and zstandard (Debian python3-numpy,
//   python3-zstandard); with ACS_TEST_PYTHON_DECODER=1 (.ci/run) a missing one fails instead;
// - the Python openai SDK: a python3 that imports `openai` (ACS_TEST_PYTHON_OPENAI names one, else
//   /usr/bin/python3). Debian has no package of it and CI reaches no PyPI, so without one the test
//   sends the example's request (its `extra_body` merged into the body, as the SDK sends it) over
//   plain HTTP and checks what the example prints from the answer;
// - Python gRPC and Go: the Debian packages of the client test (clients-python-go.test.ts);
//   with ACS_CLIENT_TESTS=1 a missing one fails instead. Go builds offline: `go mod tidy` (which
//   would fetch grpc and protobuf) is replaced by a vendor/ of Debian's sources
//   (test/helpers/go-vendor.ts); the rest of the example runs as written.
import { execFile, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { delimiter, join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { jsDecoder, type TensorDict } from "../helpers/decode-tensor.js";
import { vendorDebianModules } from "../helpers/go-vendor.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { atGateway, readmeExample } from "../helpers/readme-examples.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const run = promisify(execFile);
const root = join(import.meta.dirname, "..", "..");

function pythonHas(python: string, modules: string): boolean {
  return existsSync(python) && spawnSync(python, ["-c", `import ${modules}`]).status === 0;
}

function onPath(bin: string): boolean {
  return (process.env.PATH ?? "").split(delimiter).some((dir) => existsSync(join(dir, bin)));
}

const numpyPython = pythonHas("/usr/bin/python3", "numpy, zstandard");
const pythonDecoderRequired = process.env.ACS_TEST_PYTHON_DECODER === "1";
const openaiPython = [process.env.ACS_TEST_PYTHON_OPENAI, "/usr/bin/python3"].find(
  (python): python is string => python !== undefined && pythonHas(python, "openai"),
);
const clientsRequired = process.env.ACS_CLIENT_TESTS === "1";
const grpcPython =
  pythonHas("/usr/bin/python3", "grpc, google.protobuf") && onPath("protoc") && onPath("grpc_python_plugin");
const goTools =
  ["go", "protoc-gen-go", "protoc-gen-go-grpc"].every(onPath) &&
  existsSync("/usr/share/gocode/src/google.golang.org/grpc");

interface Completion {
  choices: Array<{ text: string }>;
  activations?: { residual_stream: TensorDict };
}

describe("proto/EXAMPLES.md examples against a real gateway", () => {
  let stack: Stack;
  let hostPort: string;
  let work: string;

  beforeAll(async () => {
    stack = await startStack({ preset: "llama-8b" });
    hostPort = new URL(stack.url).host;
    // Under the checkout (dist/ is ignored by git), so that decode.ts resolves `fzstd`.
    mkdirSync(join(root, "dist"), { recursive: true });
    work = mkdtempSync(join(root, "dist", "readme-examples-"));
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  /** Runs a shell example of EXAMPLES.md (aimed at the test's gateway) with bash -e. */
  async function sh(code: string, cwd: string, env: Record<string, string> = {}): Promise<string> {
    const { stdout } = await run("bash", ["-euo", "pipefail", "-c", atGateway(code, hostPort)], {
      cwd,
      env: { ...process.env, ...env },
      maxBuffer: 64 * 1024 * 1024,
    });
    return stdout;
  }

  async function rest(body: Record<string, unknown>): Promise<Completion> {
    const res = await fetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    return (await res.json()) as Completion;
  }

  it("streaming with curl -N: chunks of text, the usage chunk, [DONE]", async () => {
    const example = readmeExample("stream-curl");
    expect(example.lang).toBe("sh");
    const chunks = sseChunks<{
      choices: Array<{ text: string; finish_reason: string | null }>;
      usage: { completion_tokens: number } | null;
    }>(await sh(example.code, work));
    expect(chunks.length).toBeGreaterThan(1);
    const usage = chunks.at(-1);
    expect(usage?.choices).toEqual([]);
    const tokens = chunks.slice(0, -1);
    expect(tokens.every((c) => c.choices.length === 1)).toBe(true);
    // The example samples (temperature 1), so end-of-text may come before max_tokens: one chunk per
    // token, and 8 of them exactly when the stream ended at the length.
    expect(usage?.usage?.completion_tokens).toBe(tokens.length);
    const finish = tokens.at(-1)?.choices[0]?.finish_reason;
    expect(finish === "length" ? 8 : finish === "stop" ? tokens.length : -1).toBe(tokens.length);
    expect(tokens.length).toBeLessThanOrEqual(8);
  });

  it("a steering request (curl, body built with python3): served, and the vector changes the text", async () => {
    const example = readmeExample("steering-curl");
    const steered = JSON.parse(await sh(example.code, work)) as Completion & { error?: unknown };
    expect(steered.error).toBeUndefined();
    const plain = await rest({ model: "llama-8b", prompt: "The sky is", max_tokens: 8, temperature: 0 });
    expect(steered.choices[0]?.text).not.toBe(plain.choices[0]?.text);
  });

  describe("a capture, decoded by the decoders of EXAMPLES.md", () => {
    let expected: { shape: number[]; last_position_norms: number[] };

    beforeAll(async () => {
      await sh(readmeExample("capture-curl").code, work);
      const capture = JSON.parse(readFileSync(join(work, "capture.json"), "utf8")) as Completion;
      const tensor = capture.activations?.residual_stream as TensorDict;
      // EXAMPLES.md promises bf16 as int16 bits, zstd-compressed: what the decoders are shown on.
      expect(tensor).toMatchObject({ dtype: "int16", original_dtype: "torch.bfloat16", compression: "zstd" });
      const decoded = jsDecoder.decode([tensor])[0];
      if (decoded === undefined) throw new Error("the decoder returned no tensor");
      const [layers, positions, hidden] = decoded.shape as [number, number, number];
      const values = decoded.values;
      const norms = Array.from({ length: layers }, (_, l) => {
        let sum = 0;
        for (let h = 0; h < hidden; h++)
          sum += (values[((l + 1) * positions - 1) * hidden + h] as number) ** 2;
        return Math.sqrt(sum);
      });
      expect(layers).toBe(2);
      expected = { shape: decoded.shape, last_position_norms: norms };
    }, 60_000);

    function expectSameDecoding(stdout: string): void {
      const got = JSON.parse(stdout) as typeof expected;
      expect(got.shape).toEqual(expected.shape);
      expect(got.last_position_norms).toHaveLength(expected.last_position_norms.length);
      got.last_position_norms.forEach((norm, l) => {
        const want = expected.last_position_norms[l] as number;
        expect(want).toBeGreaterThan(0);
        expect(Math.abs(norm - want) / want).toBeLessThan(1e-9);
      });
    }

    it("TypeScript (tsx, fzstd)", async () => {
      const example = readmeExample("decode-ts");
      expect(example.lang).toBe("ts");
      writeFileSync(join(work, "decode.ts"), example.code);
      const { stdout } = await run(
        "bash",
        ["-c", `"${join(root, "node_modules", ".bin", "tsx")}" decode.ts < capture.json`],
        {
          cwd: work,
        },
      );
      expectSameDecoding(stdout);
    });

    it.skipIf(!numpyPython && !pythonDecoderRequired)(
      `Python (numpy, zstandard)${numpyPython ? "" : ": skipped, /usr/bin/python3 lacks numpy or zstandard (Debian python3-numpy python3-zstandard; ACS_TEST_PYTHON_DECODER=1 fails instead)"}`,
      async () => {
        const example = readmeExample("decode-python");
        expect(example.lang).toBe("python");
        writeFileSync(join(work, "decode.py"), example.code);
        const { stdout } = await run("bash", ["-c", "/usr/bin/python3 decode.py < capture.json"], {
          cwd: work,
        });
        expectSameDecoding(stdout);
      },
    );
  });

  it(
    openaiPython
      ? `the Python openai SDK with extra_body (${openaiPython})`
      : "the Python openai SDK's request with extra_body, over plain HTTP (no python3 here imports openai: Debian has no package of it, CI no PyPI; ACS_TEST_PYTHON_OPENAI names one)",
    async () => {
      const example = readmeExample("openai-python");
      expect(example.lang).toBe("python");
      const request = { model: "llama-8b", prompt: "The sky is", max_tokens: 8, temperature: 0 };
      const extraBody = { top_k: 20, output_residual_stream: [15, 20] };
      // The request below is the example's: its create() arguments, extra_body merged into the body.
      expect(example.code).toContain(
        'model="llama-8b", prompt="The sky is", max_tokens=8, temperature=0,\n    extra_body={"top_k": 20, "output_residual_stream": [15, 20]},',
      );
      const answer = await rest({ ...request, ...extraBody });
      const shape = answer.activations?.residual_stream.shape;
      expect(shape).toEqual([2, expect.any(Number), 4096]);
      if (openaiPython === undefined) return;
      writeFileSync(join(work, "openai_example.py"), atGateway(example.code, hostPort));
      const { stdout } = await run(openaiPython, [join(work, "openai_example.py")], { cwd: work });
      const [text, printedShape, streamed] = stdout.split("\n");
      expect(text).toBe(answer.choices[0]?.text);
      expect(JSON.parse(printedShape as string)).toEqual(shape);
      expect(streamed?.length).toBeGreaterThan(0);
    },
  );

  it.skipIf(!grpcPython && !clientsRequired)(
    `a Python gRPC client in a venv over Debian's grpcio${grpcPython ? "" : ": skipped, needs python3-grpcio, python3-protobuf, protobuf-compiler, protobuf-compiler-grpc (ACS_CLIENT_TESTS=1 fails instead)"}`,
    async () => {
      const venv = readmeExample("python-venv");
      const client = readmeExample("python-grpc");
      const dir = join(work, "python");
      mkdirSync(dir);
      writeFileSync(join(dir, "client.py"), atGateway(client.code, hostPort));
      const code = venv.code
        .replaceAll("dist/clients", join(dir, "clients"))
        .replaceAll(".venv", join(dir, "venv"))
        .replaceAll("client.py", join(dir, "client.py"));
      const stdout = await sh(code, root);
      expect(readFileSync(join(dir, "venv", "pyvenv.cfg"), "utf8")).toContain(
        "include-system-site-packages = true",
      );
      // after npm's lines: the completion's text, the streamed text, then the refusal's envelope
      expect(stdout).toMatch(
        /StatusCode\.NOT_FOUND model_not_found The model `nope` does not exist.* req_[0-9a-f]{32}\n$/,
      );
    },
    300_000,
  );

  it.skipIf(!goTools && !clientsRequired)(
    `a Go program built in module mode${goTools ? "" : ": skipped, needs golang, golang-google-grpc-dev, golang-google-protobuf-dev, protoc-gen-go, protoc-gen-go-grpc (ACS_CLIENT_TESTS=1 fails instead)"}`,
    async () => {
      const setup = readmeExample("go-module").code;
      const main = readmeExample("go-main");
      expect(main.lang).toBe("go");
      const module = join(work, "acsdemo");
      const tidy = "go mod tidy && go build -o acsdemo .";
      const [before, after] = setup.split(tidy);
      expect(after, `the go-module example ends with \`${tidy}\``).toBeDefined();
      const env = { GO111MODULE: "on", GOFLAGS: "", GOPROXY: "off" };
      await sh((before as string).replaceAll("../acsdemo", module), root, env);
      writeFileSync(join(module, "main.go"), atGateway(main.code, hostPort));
      // Offline, in place of `go mod tidy`: Debian's sources as the module's vendor/.
      vendorDebianModules(module, {
        "buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go": "./protovalidate",
      });
      await sh("go build -o acsdemo .", module, { ...env, GOFLAGS: "-mod=vendor" });
      const { stdout } = await run(join(module, "acsdemo"), [], { cwd: module });
      // the streamed text (sampled: it may hold newlines), then the refusal's code and request id
      const lines = stdout.trimEnd().split("\n");
      expect(lines.length).toBeGreaterThanOrEqual(2);
      expect(lines.slice(0, -1).join("\n").length).toBeGreaterThan(0);
      expect(lines.at(-1)).toMatch(/^NotFound model_not_found req_[0-9a-f]{32}$/);
    },
    600_000,
  );
});
