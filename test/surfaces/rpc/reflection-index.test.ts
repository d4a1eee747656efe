// The answers of gRPC server reflection, from the descriptors embedded in gen/: each file comes with
// the imports it needs (a client can build a complete registry from them), once per stream.
import { create, createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, createClient, createRouterTransport } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CompletionsService } from "../../../gen/acs/v1/completions_pb.js";
import { Health } from "../../../gen/grpc/health/v1/health_pb.js";
import {
  type ServerReflectionRequest,
  ServerReflectionRequestSchema,
  type ServerReflectionResponse,
} from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ServerReflectionV1Alpha } from "../../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { createReflectionIndex, createReflectionRoutes } from "../../../src/surfaces/rpc/index.js";

const index = createReflectionIndex([CompletionsService, Health]);

function ask(messageRequest: ServerReflectionRequest["messageRequest"], sent = new Set<string>()) {
  return index.answer(create(ServerReflectionRequestSchema, { host: "h", messageRequest }), sent);
}

function fileNames(res: ServerReflectionResponse): string[] {
  if (res.messageResponse.case !== "fileDescriptorResponse") throw new Error(res.messageResponse.case);
  return res.messageResponse.value.fileDescriptorProto.map(
    (b) => fromBinary(FileDescriptorProtoSchema, b).name,
  );
}

describe("reflection index", () => {
  it("lists the services, the reflection services included", () => {
    const res = ask({ case: "listServices", value: "" });
    expect(res.messageResponse.case).toBe("listServicesResponse");
    if (res.messageResponse.case !== "listServicesResponse") return;
    expect(res.messageResponse.value.service.map((s) => s.name)).toEqual([
      "acs.v1.CompletionsService",
      "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
      "grpc.reflection.v1alpha.ServerReflection",
    ]);
    expect(res.validHost).toBe("h");
    expect(res.originalRequest?.messageRequest.case).toBe("listServices");
  });

  it.each([
    ["a service", "acs.v1.CompletionsService"],
    ["a method", "acs.v1.CompletionsService.CreateCompletion"],
    ["a message", "acs.v1.CreateCompletionRequest"],
    ["a field", "acs.v1.CreateCompletionRequest.max_tokens"],
    ["a oneof", "acs.v1.CreateCompletionRequest.prompt"],
    ["an enum", "acs.v1.FinishReason"],
  ])("finds the file of %s, sent first, with every import it needs", (_what, symbol) => {
    const res = ask({ case: "fileContainingSymbol", value: symbol });
    const names = fileNames(res);
    expect(names[0]).toBe("acs/v1/completions.proto");
    expect(names).toEqual(
      expect.arrayContaining([
        "acs/v1/lens.proto",
        "buf/validate/validate.proto",
        "google/protobuf/descriptor.proto",
      ]),
    );
    // Complete: a client builds a registry from these bytes alone and finds the service.
    const protos = (
      res.messageResponse.value as { fileDescriptorProto: Uint8Array[] }
    ).fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b));
    const byName = new Map(protos.map((p) => [p.name, p]));
    const [head] = protos;
    if (head === undefined) throw new Error("no file");
    const registry = createFileRegistry(head, (name) => byName.get(name));
    expect(registry.getService("acs.v1.CompletionsService")?.methods.map((m) => m.name)).toEqual([
      "CreateCompletion",
      "StreamCompletion",
      "ListModels",
      "Tokenize",
      "Detokenize",
    ]);
  });

  it("sends each file once per stream", () => {
    const sent = new Set<string>();
    const first = fileNames(ask({ case: "fileContainingSymbol", value: "acs.v1.CompletionsService" }, sent));
    const again = fileNames(ask({ case: "fileByFilename", value: "acs/v1/lens.proto" }, sent));
    expect(first).toContain("acs/v1/lens.proto");
    // Already sent: answered with the file itself, its imports not again.
    expect(again).toEqual(["acs/v1/lens.proto"]);
  });

  it("answers file_by_filename for an import", () => {
    expect(fileNames(ask({ case: "fileByFilename", value: "buf/validate/validate.proto" }))[0]).toBe(
      "buf/validate/validate.proto",
    );
  });

  it("knows the extensions the files declare (protovalidate's options)", () => {
    const res = ask({ case: "allExtensionNumbersOfType", value: "google.protobuf.FieldOptions" });
    expect(res.messageResponse.case).toBe("allExtensionNumbersResponse");
    if (res.messageResponse.case !== "allExtensionNumbersResponse") return;
    expect(res.messageResponse.value.extensionNumber).toContain(1159); // buf.validate.field
    const file = ask({
      case: "fileContainingExtension",
      value: {
        $typeName: "grpc.reflection.v1.ExtensionRequest",
        containingType: "google.protobuf.FieldOptions",
        extensionNumber: 1159,
      },
    });
    expect(fileNames(file)[0]).toBe("buf/validate/validate.proto");
  });

  it.each([
    ["fileContainingSymbol", "acs.v1.Nope"],
    ["fileByFilename", "nope.proto"],
    ["allExtensionNumbersOfType", "acs.v1.Nope"],
  ] as const)("%s of an unknown name is NOT_FOUND in the stream", (kind, value) => {
    const res = ask({ case: kind, value });
    expect(res.messageResponse.case).toBe("errorResponse");
    if (res.messageResponse.case !== "errorResponse") return;
    expect(res.messageResponse.value.errorCode).toBe(Code.NotFound);
    expect(res.messageResponse.value.errorMessage).toContain(value);
  });
});

describe("v1alpha", () => {
  it("answers like v1 (same messages, its own package)", async () => {
    const transport = createRouterTransport(createReflectionRoutes([CompletionsService, Health]));
    const client = createClient(ServerReflectionV1Alpha, transport);
    async function* requests() {
      yield { host: "", messageRequest: { case: "listServices" as const, value: "" } };
      yield {
        host: "",
        messageRequest: { case: "fileContainingSymbol" as const, value: "grpc.health.v1.Health" },
      };
    }
    const answers = [];
    for await (const res of client.serverReflectionInfo(requests())) answers.push(res);
    expect(answers.map((a) => a.messageResponse.case)).toEqual([
      "listServicesResponse",
      "fileDescriptorResponse",
    ]);
    const files = answers[1]?.messageResponse.value as { fileDescriptorProto: Uint8Array[] };
    expect(fromBinary(FileDescriptorProtoSchema, files.fileDescriptorProto[0] as Uint8Array).name).toBe(
      "grpc/health/v1/health.proto",
    );
  });
});
