import {
  create,
  createRegistry,
  type DescFile,
  type DescService,
  fromBinary,
  type Registry,
  toBinary,
} from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, type ConnectRouter } from "@connectrpc/connect";
import {
  ServerReflection,
  type ServerReflectionRequest,
  ServerReflectionRequestSchema,
  type ServerReflectionResponse,
  ServerReflectionResponseSchema,
} from "../../../gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflectionRequestSchema as ServerReflectionRequestSchemaV1Alpha,
  ServerReflectionResponseSchema as ServerReflectionResponseSchemaV1Alpha,
  ServerReflection as ServerReflectionV1Alpha,
} from "../../../gen/grpc/reflection/v1alpha/reflection_pb.js";

/** The reflection services themselves (listed with the services they describe). */
export const reflectionServices: readonly DescService[] = [ServerReflection, ServerReflectionV1Alpha];

/**
 * Every file `files` need, each once, each before the files that import it, by file name
 * (`acs/v1/completions.proto`; protobuf-es's DescFile.name has no `.proto`).
 */
function withDependencies(files: Iterable<DescFile>): Map<string, DescFile> {
  const out = new Map<string, DescFile>();
  const visit = (file: DescFile): void => {
    if (out.has(file.proto.name)) return;
    for (const dep of file.dependencies) visit(dep);
    out.set(file.proto.name, file);
  };
  for (const file of files) visit(file);
  return out;
}

/** The answers of reflection, over a fixed set of services and the files they are built from. */
export interface ReflectionIndex {
  /** Names of the services served (list_services). */
  readonly serviceNames: readonly string[];
  /** Answers one request; `sent` holds the files already sent on this stream (not sent again). */
  answer(request: ServerReflectionRequest, sent: Set<string>): ServerReflectionResponse;
}

/** The files reflection answers from: by file name, in a registry, encoded once each. */
interface ReflectionFiles {
  readonly files: Map<string, DescFile>;
  readonly registry: Registry;
  readonly encoded: Map<string, Uint8Array>;
  readonly serviceNames: readonly string[];
}

type MessageResponse = ServerReflectionResponse["messageResponse"];
type Question = ServerReflectionRequest["messageRequest"];

function bytesOf(index: ReflectionFiles, file: DescFile): Uint8Array {
  let bytes = index.encoded.get(file.proto.name);
  if (bytes === undefined) {
    bytes = toBinary(FileDescriptorProtoSchema, file.proto);
    index.encoded.set(file.proto.name, bytes);
  }
  return bytes;
}

/** The file that declares `symbol`: a type, a service, or a method, field or oneof of one. */
function fileOfSymbol(registry: Registry, symbol: string): DescFile | undefined {
  const type = registry.get(symbol);
  if (type !== undefined) return type.file;
  const dot = symbol.lastIndexOf(".");
  if (dot <= 0) return undefined;
  const parent = registry.get(symbol.slice(0, dot));
  const member = symbol.slice(dot + 1);
  switch (parent?.kind) {
    case "service":
      return parent.methods.some((m) => m.name === member) ? parent.file : undefined;
    case "message":
      return parent.fields.some((f) => f.name === member) || parent.oneofs.some((o) => o.name === member)
        ? parent.file
        : undefined;
    default:
      return undefined;
  }
}

/** `file` and the files it imports that were not sent yet, `file` first (as gRPC servers do). */
function fileResponse(index: ReflectionFiles, file: DescFile, sent: Set<string>): MessageResponse {
  const needed = [...withDependencies([file]).values()].reverse().filter((f) => !sent.has(f.proto.name));
  if (needed.length === 0) needed.push(file); // asked again: answer with the file itself
  for (const f of needed) sent.add(f.proto.name);
  return {
    case: "fileDescriptorResponse",
    value: {
      $typeName: "grpc.reflection.v1.FileDescriptorResponse",
      fileDescriptorProto: needed.map((f) => bytesOf(index, f)),
    },
  };
}

function errorResponse(errorCode: Code, errorMessage: string): MessageResponse {
  return {
    case: "errorResponse",
    value: { $typeName: "grpc.reflection.v1.ErrorResponse", errorCode, errorMessage },
  };
}

const notFound = (message: string): MessageResponse => errorResponse(Code.NotFound, message);

/** The file of `file` (or NOT_FOUND with `missing`'s words). */
function fileOr(index: ReflectionFiles, file: DescFile | undefined, sent: Set<string>, missing: string) {
  return file === undefined ? notFound(missing) : fileResponse(index, file, sent);
}

function extensionNumbers(index: ReflectionFiles, typeName: string): MessageResponse {
  const extendee = index.registry.getMessage(typeName);
  if (extendee === undefined) return notFound(`type not found: ${typeName}`);
  const numbers: number[] = [];
  for (const type of index.registry) {
    if (type.kind === "extension" && type.extendee.typeName === extendee.typeName) numbers.push(type.number);
  }
  return {
    case: "allExtensionNumbersResponse",
    value: {
      $typeName: "grpc.reflection.v1.ExtensionNumberResponse",
      baseTypeName: extendee.typeName,
      extensionNumber: numbers.sort((a, b) => a - b),
    },
  };
}

function listServices(index: ReflectionFiles): MessageResponse {
  return {
    case: "listServicesResponse",
    value: {
      $typeName: "grpc.reflection.v1.ListServiceResponse",
      service: index.serviceNames.map((name) => ({ $typeName: "grpc.reflection.v1.ServiceResponse", name })),
    },
  };
}

/** The answer to one question. */
function answerTo(index: ReflectionFiles, ask: Question, sent: Set<string>): MessageResponse {
  switch (ask.case) {
    case "fileByFilename":
      return fileOr(index, index.files.get(ask.value), sent, `file not found: ${ask.value}`);
    case "fileContainingSymbol":
      return fileOr(index, fileOfSymbol(index.registry, ask.value), sent, `symbol not found: ${ask.value}`);
    case "fileContainingExtension": {
      const { containingType, extensionNumber } = ask.value;
      const extendee = index.registry.getMessage(containingType);
      const extension =
        extendee === undefined ? undefined : index.registry.getExtensionFor(extendee, extensionNumber);
      return fileOr(
        index,
        extension?.file,
        sent,
        `extension not found: ${containingType} ${extensionNumber}`,
      );
    }
    case "allExtensionNumbersOfType":
      return extensionNumbers(index, ask.value);
    case "listServices":
      return listServices(index);
    default:
      return errorResponse(
        Code.InvalidArgument,
        "the request names no question (file_by_filename, file_containing_symbol, …)",
      );
  }
}

/**
 * Builds the reflection index of `services` (plus the reflection services) from the file
 * descriptors embedded in the generated code (`gen/`), through a protobuf-es registry: each
 * service's file and its imports (acs/v1, buf/validate, google/protobuf, grpc/health/v1, …).
 */
export function createReflectionIndex(services: readonly DescService[]): ReflectionIndex {
  const all = [...services, ...reflectionServices.filter((s) => !services.includes(s))];
  const files = withDependencies(all.map((s) => s.file));
  const index: ReflectionFiles = {
    files,
    registry: createRegistry(...files.values()),
    encoded: new Map(),
    serviceNames: all.map((s) => s.typeName),
  };
  return {
    serviceNames: index.serviceNames,
    answer(request, sent) {
      return create(ServerReflectionResponseSchema, {
        validHost: request.host,
        originalRequest: request,
        messageResponse: answerTo(index, request.messageRequest, sent),
      });
    },
  };
}

/**
 * Registers gRPC server reflection — `grpc.reflection.v1.ServerReflection` and its predecessor
 * `grpc.reflection.v1alpha.ServerReflection` (same messages; older clients ask for it) — over
 * `services`, so that `buf curl --list-methods`, grpcurl and Postman can discover and call the API
 * without .proto files. ServerReflectionInfo is a bidirectional stream (gRPC over HTTP/2): one
 * answer per question, NOT_FOUND as an `error_response` in the stream, each file sent once per
 * stream with the imports it needs.
 */
export function createReflectionRoutes(services: readonly DescService[]): (router: ConnectRouter) => void {
  const index = createReflectionIndex(services);
  return (router) => {
    router.service(ServerReflection, {
      async *serverReflectionInfo(requests) {
        const sent = new Set<string>();
        for await (const request of requests) yield index.answer(request, sent);
      },
    });
    router.service(ServerReflectionV1Alpha, {
      async *serverReflectionInfo(requests) {
        const sent = new Set<string>();
        for await (const request of requests) {
          const asked = fromBinary(
            ServerReflectionRequestSchema,
            toBinary(ServerReflectionRequestSchemaV1Alpha, request),
          );
          const answer = index.answer(asked, sent);
          yield fromBinary(
            ServerReflectionResponseSchemaV1Alpha,
            toBinary(ServerReflectionResponseSchema, answer),
          );
        }
      },
    });
  };
}
