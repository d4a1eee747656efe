// The types of the OpenAPI document (src/surfaces/rest/openapi.ts) and the few schema builders its parts
// share.

/** The OpenAPI 3.1 document, as far as its checkers read it. */
export type OpenApiDocument = {
  readonly openapi: string;
  readonly paths: Record<string, Record<string, OpenApiOperation>>;
  readonly components: { readonly schemas: Record<string, JsonSchema> } & Record<string, unknown>;
} & Record<string, unknown>;

/** A JSON Schema (2020-12, the dialect of OpenAPI 3.1), or a `$ref`. */
export type JsonSchema = Record<string, unknown>;

/** An operation of the document, as far as its checkers read it. */
export interface OpenApiOperation {
  readonly operationId: string;
  readonly responses: Record<string, OpenApiResponse | { readonly $ref: string }>;
  readonly [key: string]: unknown;
}

/** A response: its headers and content by media type. */
export interface OpenApiResponse {
  readonly description: string;
  readonly headers?: Record<string, unknown>;
  readonly content?: Record<string, { readonly schema: JsonSchema; readonly "x-sse-data"?: JsonSchema }>;
}

/** A `$ref` to the component schema `name`. */
export const ref = (name: string): JsonSchema => ({ $ref: `#/components/schemas/${name}` });

/** `schema`, or null ("left out" in a request; "not asked for" in a response). */
export const orNull = (schema: JsonSchema): JsonSchema => ({ anyOf: [schema, { type: "null" }] });

/** An int32: an integer from −2^31 to 2^31 − 1. */
export const INT32 = { type: "integer", minimum: -(2 ** 31), maximum: 2 ** 31 - 1 } as const;

/** A list of integers (token ids of a response). */
export const integerArray = { type: "array", items: { type: "integer" } } as const;

/** The `X-Request-Id` header every response carries. */
export const requestIdHeader = { "X-Request-Id": { $ref: "#/components/headers/X-Request-Id" } };
