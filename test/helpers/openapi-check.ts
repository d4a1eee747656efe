// Every REST response an end-to-end test gets, checked against the OpenAPI document the gateway
// serves (src/surfaces/rest/openapi.ts) with ajv (JSON Schema 2020-12, the dialect of OpenAPI 3.1).
//
// Use `checkedFetch` instead of `fetch` (or pass it to the openai SDK as its `fetch`), and
// `afterEach(assertConforming)`: a response that does not conform fails the test — the read of
// its body rejects with the reasons, and assertConforming throws them (in case the reader caught
// it). Checked: the operation exists (path template and method), its status is documented (an
// unknown route or method: an error envelope of the catalogue's status), the Content-Type is one
// the response lists, the body validates against its schema, required headers are present and
// every documented header matches its schema; a `text/event-stream` has only `data:` lines and
// comments, each data event validates against the media type's `x-sse-data`, and a stream read to
// its end ends with `data: [DONE]`. A stream the test cancels is not checked. RPC requests
// (Connect, gRPC, gRPC-Web) and CORS preflights pass unchecked.
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import {
  errorStatuses,
  type OpenApiDocument,
  type OpenApiOperation,
  type OpenApiResponse,
  openApiDocument,
} from "../../src/surfaces/rest/openapi.js";
import { exchange, type WireRequest, type WireResponse } from "./rpc-wire.js";

const DOC_ID = "https://acs-gateway.invalid/openapi.json";

/** One non-conforming response. */
export interface OpenApiViolation {
  readonly method: string;
  readonly url: string;
  readonly status: number;
  readonly problems: readonly string[];
}

/** A checker of responses against one document (the served one by default). */
export interface OpenApiChecker {
  /** The problems of one response (empty when it conforms). */
  check(response: CheckedResponse): string[];
  /** The problems of `value` against the component schema `name` (empty when it conforms). */
  validate(name: string, value: unknown): string[];
}

/** What the checker reads of a response. */
export interface CheckedResponse {
  readonly method: string;
  readonly url: string;
  readonly status: number;
  readonly headers: Headers;
  /** The whole body as text ("" for HEAD or no body). */
  readonly body: string;
  /** True when the body was read to its end (a stream must then end with `[DONE]`). */
  readonly complete: boolean;
}

/** `/v1/models/{model}` → a regex of the path (a parameter may hold `/`: model ids do). */
function templateRegex(template: string): RegExp {
  const source = template
    .split(/\{[^}]+\}/)
    .map((part) => part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"))
    .join(".+");
  return new RegExp(`^${source}$`);
}

/** JSON pointer escaping of one token. */
const pointerToken = (token: string) => token.replace(/~/g, "~0").replace(/\//g, "~1");

/** The OpenAPI keywords of the document's root that are not JSON Schema keywords. */
const documentKeywords = [
  "openapi",
  "info",
  "jsonSchemaDialect",
  "servers",
  "security",
  "tags",
  "paths",
  "components",
  "webhooks",
  "externalDocs",
];

/** A checker of responses against `doc`. */
export function createOpenApiChecker(doc: OpenApiDocument = openApiDocument): OpenApiChecker {
  const ajv = new Ajv2020({ allErrors: true, strict: true, strictTypes: false });
  addFormats.default(ajv);
  ajv.addVocabulary(documentKeywords);
  ajv.addSchema({ ...doc, $id: DOC_ID });
  const compiled = new Map<string, ValidateFunction>();
  /** The validator of the schema at `pointer` in the document. */
  const schemaAt = (pointer: string): ValidateFunction => {
    let validate = compiled.get(pointer);
    if (validate === undefined) {
      validate = ajv.compile({ $ref: `${DOC_ID}#${pointer}` });
      compiled.set(pointer, validate);
    }
    return validate;
  };
  const resolve = (value: unknown): { value: Record<string, unknown>; pointer: string } | undefined => {
    const reference = (value as { $ref?: string } | undefined)?.$ref;
    if (reference === undefined) return undefined;
    const pointer = reference.slice(1);
    let node: unknown = doc;
    for (const token of pointer.split("/").slice(1)) {
      node = (node as Record<string, unknown>)[token.replace(/~1/g, "/").replace(/~0/g, "~")];
    }
    return { value: node as Record<string, unknown>, pointer };
  };
  const templates = Object.keys(doc.paths).map((template) => ({ template, regex: templateRegex(template) }));

  const validateAt = (pointer: string, value: unknown, what: string): string[] => {
    const validate = schemaAt(pointer);
    if (validate(value)) return [];
    return [`${what} does not match ${pointer}: ${ajv.errorsText(validate.errors, { dataVar: "body" })}`];
  };

  /** The problems of `res` against one response object (at `pointer` in the document). */
  const checkAgainst = (res: CheckedResponse, response: OpenApiResponse, pointer: string): string[] => {
    const problems: string[] = [];
    for (const [name, declared] of Object.entries(response.headers ?? {})) {
      const header = resolve(declared) ?? { value: declared as Record<string, unknown>, pointer: "" };
      const value = res.headers.get(name);
      if (value === null) {
        if (header.value.required === true) problems.push(`header ${name} is missing`);
        continue;
      }
      const schemaPointer = header.pointer
        ? `${header.pointer}/schema`
        : `${pointer}/headers/${pointerToken(name)}/schema`;
      problems.push(...validateAt(schemaPointer, value, `header ${name}`));
    }
    if (res.method === "HEAD") return problems;
    const content = response.content;
    if (content === undefined) {
      if (res.body !== "") problems.push("a body where the document has none");
      return problems;
    }
    const type = (res.headers.get("content-type") ?? "").split(";", 1)[0]?.trim().toLowerCase() ?? "";
    const media = content[type];
    if (media === undefined) {
      problems.push(`Content-Type ${JSON.stringify(type)} is not one of ${Object.keys(content).join(", ")}`);
      return problems;
    }
    const mediaPointer = `${pointer}/content/${pointerToken(type)}`;
    if (type === "application/json") {
      let json: unknown;
      try {
        json = JSON.parse(res.body);
      } catch {
        return [...problems, `the body is not JSON: ${res.body.slice(0, 200)}`];
      }
      problems.push(...validateAt(`${mediaPointer}/schema`, json, "the body"));
    } else if (type === "text/event-stream") {
      problems.push(
        ...checkEventStream(
          res,
          media["x-sse-data"] === undefined ? undefined : `${mediaPointer}/x-sse-data`,
        ),
      );
    }
    return problems;
  };

  const checkEventStream = (res: CheckedResponse, dataPointer: string | undefined): string[] => {
    const problems: string[] = [];
    const data: string[] = [];
    for (const line of res.body.split(/\r\n|\r|\n/)) {
      if (line === "" || line.startsWith(":")) continue;
      if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else problems.push(`a line that is not data or a comment: ${JSON.stringify(line.slice(0, 80))}`);
    }
    data.forEach((event, k) => {
      if (event === "[DONE]") {
        if (k !== data.length - 1) problems.push("data after [DONE]");
        return;
      }
      let json: unknown;
      try {
        json = JSON.parse(event);
      } catch {
        problems.push(`data event ${k} is not JSON: ${event.slice(0, 200)}`);
        return;
      }
      if (dataPointer !== undefined) problems.push(...validateAt(dataPointer, json, `data event ${k}`));
    });
    if (res.complete && data.at(-1) !== "[DONE]") problems.push("the stream does not end with data: [DONE]");
    return problems;
  };

  return {
    validate: (name, value) => validateAt(`/components/schemas/${name}`, value, name),
    check(res) {
      const path = new URL(res.url).pathname;
      const method = res.method.toLowerCase();
      const match = templates.find((t) => t.regex.test(path));
      const operations = match === undefined ? undefined : doc.paths[match.template];
      const operation: OpenApiOperation | undefined = operations?.[method === "head" ? "get" : method];
      if (match !== undefined && operation !== undefined) {
        const declared = operation.responses[String(res.status)];
        if (declared === undefined) {
          return [`status ${res.status} is not documented for ${res.method} ${match.template}`];
        }
        const resolved = resolve(declared);
        const pointer =
          resolved?.pointer ??
          `/paths/${pointerToken(match.template)}/${method === "head" ? "get" : method}/responses/${res.status}`;
        return checkAgainst(res, (resolved?.value ?? declared) as OpenApiResponse, pointer);
      }
      // No operation: an unknown route or method answers the envelope with the catalogue's status.
      if (!errorStatuses.includes(res.status)) {
        return [
          `${res.method} ${path} is not in the document and answered ${res.status}, not an error status`,
        ];
      }
      const pointer = `/components/responses/Error${res.status}`;
      const response = resolve({ $ref: `#${pointer}` })?.value as unknown as OpenApiResponse;
      return checkAgainst(res, response, pointer);
    },
  };
}

/** Every violation seen by {@link checkedFetch} since the last {@link assertConforming}. */
export const violations: OpenApiViolation[] = [];

let defaultChecker: OpenApiChecker | undefined;
const checker = () => {
  defaultChecker ??= createOpenApiChecker();
  return defaultChecker;
};

/** An RPC path: /<package>.<Service>/<Method>. */
const rpcPath = /^\/[A-Za-z_][\w.]*\.[A-Za-z_]\w*\/[A-Za-z_]\w*$/;
const rpcType = /^application\/(grpc|connect\+|proto)/i;

function requestOf(
  input: string | URL | Request,
  init?: RequestInit,
): { method: string; url: string; type: string } {
  if (input instanceof Request) {
    return {
      method: init?.method ?? input.method,
      url: input.url,
      type: input.headers.get("content-type") ?? "",
    };
  }
  return {
    method: (init?.method ?? "GET").toUpperCase(),
    url: String(input),
    type: new Headers(init?.headers).get("content-type") ?? "",
  };
}

function record(res: CheckedResponse, problems: string[]): Error | undefined {
  if (problems.length === 0) return undefined;
  const violation = { method: res.method, url: res.url, status: res.status, problems };
  violations.push(violation);
  return new Error(
    `Response does not conform to /openapi.json: ${res.method} ${res.url} → ${res.status}\n- ${problems.join("\n- ")}`,
  );
}

/**
 * `fetch`, with the response checked against the document once its body has been read to its
 * end (see the module comment). The returned Response has the same status, headers and body.
 */
export async function checkedFetch(input: string | URL | Request, init?: RequestInit): Promise<Response> {
  const req = requestOf(input, init);
  const res = await fetch(input, init);
  const path = new URL(req.url).pathname;
  if (
    req.method === "OPTIONS" ||
    rpcPath.test(path) ||
    rpcType.test(req.type) ||
    rpcType.test(res.headers.get("content-type") ?? "")
  ) {
    return res;
  }
  const base = { method: req.method, url: req.url, status: res.status, headers: res.headers };
  if (res.body === null) {
    const error = record(
      { ...base, body: "", complete: true },
      checker().check({ ...base, body: "", complete: true }),
    );
    if (error !== undefined) throw error;
    return res;
  }
  const decoder = new TextDecoder();
  let text = "";
  const checking = new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      text += decoder.decode(chunk, { stream: true });
      controller.enqueue(chunk);
    },
    flush(controller) {
      text += decoder.decode();
      const whole = { ...base, body: text, complete: true };
      const error = record(whole, checker().check(whole));
      if (error !== undefined) controller.error(error);
    },
  });
  const wrapped = new Response(res.body.pipeThrough(checking), {
    status: res.status,
    statusText: res.statusText,
    headers: res.headers,
  });
  Object.defineProperty(wrapped, "url", { value: res.url });
  return wrapped;
}

/** Throws the violations seen since the last call (and forgets them); use in `afterEach`. */
export function assertConforming(): void {
  const seen = violations.splice(0);
  if (seen.length === 0) return;
  throw new Error(
    `${seen.length} response(s) do not conform to /openapi.json:\n${seen
      .map((v) => `${v.method} ${v.url} → ${v.status}\n  - ${v.problems.join("\n  - ")}`)
      .join("\n")}`,
  );
}

/**
 * The problems of a response read by other means than {@link checkedFetch} (a raw HTTP exchange):
 * empty when it conforms. RPC responses are not for this.
 */
export function conformanceProblems(res: CheckedResponse): string[] {
  return checker().check(res);
}

/**
 * {@link exchange} (a raw HTTP/1.1 or h2c exchange), with a REST answer checked against the
 * document like {@link checkedFetch}'s (recorded for {@link assertConforming}); RPCs pass unchecked.
 */
export async function checkedExchange(baseUrl: string, req: WireRequest): Promise<WireResponse> {
  const res = await exchange(baseUrl, req);
  const type =
    Object.entries(req.headers ?? {}).find(([name]) => name.toLowerCase() === "content-type")?.[1] ?? "";
  if (req.http2 === true || rpcPath.test(req.path.split("?", 1)[0] ?? "") || rpcType.test(type)) return res;
  const checked = {
    method: req.method ?? "POST",
    url: new URL(req.path, baseUrl).href,
    status: res.status,
    headers: res.headers,
    body: res.body.toString("utf8"),
    complete: true,
  };
  record(checked, checker().check(checked));
  return res;
}
