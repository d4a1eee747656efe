/**
 * Generates gRPC clients of acs.v1 in Python (grpcio) and Go from this repository alone, offline,
 * with buf in managed mode (language options such as go_package come from the template below,
 * not from the .proto files) and the system's protoc plugins.
 *
 * Usage: `npm run generate:clients -- [OUT_DIR] [--lang python,go] [--go-package-prefix PREFIX]`
 * - OUT_DIR: default `dist/clients` (ignored by git); a relative path is taken from the directory
 *   npm was run in. Each language's directory is emptied first.
 * - `--lang`: default both.
 * - `--go-package-prefix`: the Go import path the acs/v1 package goes under, default
 *   `acs-gateway/gen/go` (package `acs-gateway/gen/go/acs/v1`, name `acsv1`).
 *
 * Output:
 * - `OUT_DIR/python`: `acs/v1/*_pb2.py` (+ `.pyi`), `acs/v1/completions_pb2_grpc.py`,
 *   `buf/validate/validate_pb2.py` (the acs messages import it: their fields carry protovalidate
 *   rules) and `google/rpc/status_pb2.py` (google.rpc.Status, to read the ErrorEnvelope detail
 *   from the `grpc-status-details-bin` trailer). Put the directory on PYTHONPATH; needs grpcio and
 *   protobuf ≥ 4.21 (Debian: python3-grpcio, python3-protobuf).
 * - `OUT_DIR/go/src`: a GOPATH tree with the acs/v1 package under PREFIX and protovalidate's
 *   generated package at its own import path (buf.build/gen/go/bufbuild/protovalidate/
 *   protocolbuffers/go/buf/validate, managed mode leaves it alone so a program that links
 *   protovalidate-go registers validate.proto once). google.rpc.Status is not generated for Go:
 *   google.golang.org/grpc/status reads it. Needs google.golang.org/grpc and
 *   google.golang.org/protobuf (Debian: golang-google-grpc-dev, golang-google-protobuf-dev,
 *   golang-github-golang-protobuf-1-5-dev; GOPATH mode:
 *   `GOPATH=OUT_DIR/go:/usr/share/gocode GO111MODULE=off`).
 *
 * Needs on PATH: protoc (Debian protobuf-compiler) and grpc_python_plugin
 * (protobuf-compiler-grpc) for Python; protoc-gen-go and protoc-gen-go-grpc (Debian packages of
 * the same names) for Go. A missing tool fails the run with the package to install.
 */
import { execFileSync } from "node:child_process";
import { accessSync, constants } from "node:fs";
import { delimiter, dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");

type Lang = "python" | "go";

/** Executables each language needs, with the Debian package that ships each. */
const tools: Record<Lang, Array<{ bin: string; debian: string }>> = {
  python: [
    { bin: "protoc", debian: "protobuf-compiler" },
    { bin: "grpc_python_plugin", debian: "protobuf-compiler-grpc" },
  ],
  go: [
    { bin: "protoc-gen-go", debian: "protoc-gen-go" },
    { bin: "protoc-gen-go-grpc", debian: "protoc-gen-go-grpc" },
  ],
};

/** Third-party files keep the options they were published with (managed mode leaves them). */
const thirdParty = ["buf/validate", "google/rpc"].map((path) => ({ path }));

function onPath(bin: string): boolean {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    try {
      accessSync(join(dir, bin), constants.X_OK);
      return true;
    } catch {}
  }
  return false;
}

/** The buf.gen.yaml (v2) of one language, as JSON. */
function template(lang: Lang, out: string, goPackagePrefix: string): object {
  const managed = {
    enabled: true,
    disable: thirdParty,
    override: [{ file_option: "go_package_prefix", value: goPackagePrefix }],
  };
  if (lang === "python") {
    const dir = join(out, "python");
    return {
      version: "v2",
      clean: true,
      managed,
      inputs: [
        {
          directory: ".",
          paths: ["proto/acs", "proto-vendor/buf/validate", "proto-vendor/google/rpc"],
        },
      ],
      plugins: [
        { protoc_builtin: "python", out: dir },
        { protoc_builtin: "pyi", out: dir },
        { local: "grpc_python_plugin", out: dir },
      ],
    };
  }
  const dir = join(out, "go", "src");
  return {
    version: "v2",
    clean: true,
    managed,
    inputs: [{ directory: ".", paths: ["proto/acs", "proto-vendor/buf/validate"] }],
    plugins: [
      { local: "protoc-gen-go", out: dir },
      { local: "protoc-gen-go-grpc", out: dir },
    ],
  };
}

function main(): void {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      lang: { type: "string", default: "python,go" },
      "go-package-prefix": { type: "string", default: "acs-gateway/gen/go" },
    },
  });
  if (positionals.length > 1) throw new Error(`expected at most one OUT_DIR, got ${positionals.join(" ")}`);
  const langs = (values.lang ?? "").split(",").map((l) => l.trim());
  for (const l of langs) {
    if (l !== "python" && l !== "go") throw new Error(`--lang: unknown language "${l}" (python, go)`);
  }
  // npm runs scripts in the package root; a relative OUT_DIR means where the user typed it.
  const base = process.env.INIT_CWD ?? process.cwd();
  const given = positionals[0] ?? join(root, "dist", "clients");
  const out = isAbsolute(given) ? given : resolve(base, given);

  const missing = (langs as Lang[]).flatMap((l) => tools[l].filter((t) => !onPath(t.bin)));
  if (missing.length > 0) {
    const list = missing.map((t) => `${t.bin} (Debian package ${t.debian})`).join(", ");
    console.error(`generate:clients: not on PATH: ${list}`);
    process.exit(1);
  }
  const buf = join(root, "node_modules", ".bin", "buf");
  for (const lang of langs as Lang[]) {
    const spec = JSON.stringify(template(lang, out, values["go-package-prefix"] ?? ""));
    execFileSync(buf, ["generate", "--template", spec], { cwd: root, stdio: "inherit" });
    console.log(`${lang}: ${join(out, lang === "python" ? "python" : "go/src")}`);
  }
}

main();
