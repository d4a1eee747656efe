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
} from "../../gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflectionRequestSchema as ServerReflectionRequestSchemaV1Alpha,
  ServerReflectionResponseSchema as ServerReflectionResponseSchemaV1Alpha,
  ServerReflection as ServerReflectionV1Alpha,
} from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";

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

/**
 * Builds the reflection index of `services` (plus the reflection services) from the file
 * descriptors embedded in the generated code (`gen/`), through a protobuf-es registry: each
 * service's file and its imports (acs/v1, buf/validate, google/protobuf, grpc/health/v1, …).
 */
export function createReflectionIndex(services: readonly DescService[]): ReflectionIndex {
  const all = [...services, ...reflectionServices.filter((s) => !services.includes(s))];
  const files = withDependencies(all.map((s) => s.file));
  const registry: Registry = createRegistry(...files.values());
  const encoded = new Map<string, Uint8Array>();
  const bytesOf = (file: DescFile): Uint8Array => {
    let bytes = encoded.get(file.proto.name);
    if (bytes === undefined) {
      bytes = toBinary(FileDescriptorProtoSchema, file.proto);
      encoded.set(file.proto.name, bytes);
    }
    return bytes;
  };

  /** The file that declares `symbol`: a type, a service, or a method, field or oneof of one. */
  const fileOfSymbol = (symbol: string): DescFile | undefined => {
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
  };

  /** `file` and the files it imports that were not sent yet, `file` first (as gRPC servers do). */
  const fileResponse = (file: DescFile, sent: Set<string>): ServerReflectionResponse["messageResponse"] => {
    const needed = [...withDependencies([file]).values()].reverse().filter((f) => !sent.has(f.proto.name));
    if (needed.length === 0) needed.push(file); // asked again: answer with the file itself
    for (const f of needed) sent.add(f.proto.name);
    return {
      case: "fileDescriptorResponse",
      value: {
        $typeName: "grpc.reflection.v1.FileDescriptorResponse",
        fileDescriptorProto: needed.map(bytesOf),
      },
    };
  };

  const notFound = (message: string): ServerReflectionResponse["messageResponse"] => ({
    case: "errorResponse",
    value: { $typeName: "grpc.reflection.v1.ErrorResponse", errorCode: Code.NotFound, errorMessage: message },
  });

  const serviceNames = all.map((s) => s.typeName);

  return {
    serviceNames,
    answer(request, sent) {
      const ask = request.messageRequest;
      let messageResponse: ServerReflectionResponse["messageResponse"];
      switch (ask.case) {
        case "fileByFilename": {
          const file = files.get(ask.value);
          messageResponse =
            file === undefined ? notFound(`file not found: ${ask.value}`) : fileResponse(file, sent);
          break;
        }
        case "fileContainingSymbol": {
          const file = fileOfSymbol(ask.value);
          messageResponse =
            file === undefined ? notFound(`symbol not found: ${ask.value}`) : fileResponse(file, sent);
          break;
        }
        case "fileContainingExtension": {
          const extendee = registry.getMessage(ask.value.containingType);
          const extension =
            extendee === undefined
              ? undefined
              : registry.getExtensionFor(extendee, ask.value.extensionNumber);
          messageResponse =
            extension === undefined
              ? notFound(`extension not found: ${ask.value.containingType} ${ask.value.extensionNumber}`)
              : fileResponse(extension.file, sent);
          break;
        }
        case "allExtensionNumbersOfType": {
          const extendee = registry.getMessage(ask.value);
          if (extendee === undefined) {
            messageResponse = notFound(`type not found: ${ask.value}`);
            break;
          }
          const numbers: number[] = [];
          for (const type of registry) {
            if (type.kind === "extension" && type.extendee.typeName === extendee.typeName)
              numbers.push(type.number);
          }
          messageResponse = {
            case: "allExtensionNumbersResponse",
            value: {
              $typeName: "grpc.reflection.v1.ExtensionNumberResponse",
              baseTypeName: extendee.typeName,
              extensionNumber: numbers.sort((a, b) => a - b),
            },
          };
          break;
        }
        case "listServices":
          messageResponse = {
            case: "listServicesResponse",
            value: {
              $typeName: "grpc.reflection.v1.ListServiceResponse",
              service: serviceNames.map((name) => ({
                $typeName: "grpc.reflection.v1.ServiceResponse",
                name,
              })),
            },
          };
          break;
        default:
          messageResponse = {
            case: "errorResponse",
            value: {
              $typeName: "grpc.reflection.v1.ErrorResponse",
              errorCode: Code.InvalidArgument,
              errorMessage: "the request names no question (file_by_filename, file_containing_symbol, …)",
            },
          };
      }
      return create(ServerReflectionResponseSchema, {
        validHost: request.host,
        originalRequest: request,
        messageResponse,
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
