// The OpenAPI 3.1 document of the REST surface (proto/API.md §1–§9), served at `GET /openapi.json`
// and rendered at `GET /docs`.
//
// What can be derived is derived. The request bodies are generated from the protos and their
// protovalidate rules (src/surfaces/rest/openapi-request-schemas.ts, src/surfaces/rest/openapi-from-proto.ts); the
// error codes, their HTTP statuses and OpenAI types come from the error catalogue
// (src/surfaces/rest/openapi-errors.ts). The responses are written out (src/surfaces/rest/openapi-response-schemas.ts),
// the routes in src/surfaces/rest/openapi-paths.ts. test/surfaces/rest/openapi.test.ts checks the document against
// the protos (every field of `acs.v1.CreateCompletionRequest`, `SteeringVector` and `Model` under
// its REST JSON name), against the REST decoder and renderers, and validates it with an OpenAPI 3.1
// schema validator; the end-to-end tests validate every REST response they get against it
// (test/helpers/openapi-check.ts).
//
// A stream (`text/event-stream`) has no JSON schema of its own in OpenAPI 3.1: its media type
// carries `x-sse-data`, the schema of each `data:` event's JSON (a chunk, or the error envelope);
// the events end with `data: [DONE]`.
import { adminPaths, adminSchemas } from "./openapi-admin.js";
import { errorEnvelopeSchema, errorResponses } from "./openapi-errors.js";
import type { OpenApiDocument } from "./openapi-json-schema.js";
import { paths } from "./openapi-paths.js";
import { requestSchemas } from "./openapi-request-schemas.js";
import { responseSchemas } from "./openapi-response-schemas.js";
import { usagePaths, usageSchemas } from "./openapi-usage.js";

export { errorCodesOfStatus, errorStatuses } from "./openapi-errors.js";
export type {
  JsonSchema,
  OpenApiDocument,
  OpenApiOperation,
  OpenApiResponse,
} from "./openapi-json-schema.js";

/** The document (see the module comment). Frozen: it is served as is. */
export const openApiDocument: OpenApiDocument = {
  openapi: "3.1.1",
  jsonSchemaDialect: "https://spec.openapis.org/oas/3.1/dialect/base",
  info: {
    title: "acs-gateway REST API",
    version: "1",
    summary: "OpenAI-compatible completions for base models, with vllm-lens activations and steering.",
    description:
      "The REST surface of the gateway (proto/API.md in the repository is the contract). The same service is served over Connect, gRPC and gRPC-Web as `acs.v1.CompletionsService` on the same port; this document covers REST only. Every response carries `X-Request-Id`; every refusal is the error envelope.",
  },
  servers: [{ url: "/", description: "This gateway" }],
  security: [{ bearerKey: [] }],
  tags: [
    { name: "completions", description: "Completions (OpenAI's `client.completions.create`)." },
    { name: "models", description: "Served models and their facts." },
    { name: "tokens", description: "vLLM's tokenizer routes, answered by the model's Inference." },
    { name: "ops", description: "Health, metrics and this document; no key needed." },
    {
      name: "admin",
      description: "API keys and the audit log (`acs.v1.AdminService` on Connect); an admin key.",
    },
  ],
  paths: { ...paths, ...adminPaths, ...usagePaths },
  components: {
    securitySchemes: {
      bearerKey: {
        type: "http",
        scheme: "bearer",
        description:
          "`Authorization: Bearer <key>`: an API key with a Budget in tokens (proto/API.md §9). A gateway run without a key store accepts any key or none.",
      },
      adminKey: {
        type: "http",
        scheme: "bearer",
        description:
          "`Authorization: Bearer <admin key>`: an admin key (`acs-admin-…`, `npm run keys -- create-admin`), for the admin API only (proto/API.md §11). An API key there is 403, as an admin key is on the other routes.",
      },
    },
    headers: {
      "X-Request-Id": {
        description: "The request's id; the same as the error envelope's `request_id`.",
        required: true,
        schema: { type: "string", pattern: "^req_[0-9a-f]{32}$" },
      },
      "X-Acs-Max-Tokens-Clamped": {
        description: "Near the end of a Budget: the lowered max_tokens (proto/API.md §3).",
        schema: { type: "string", pattern: "^[0-9]+$" },
      },
      "x-should-retry": {
        description:
          "`false` when the Budget is spent (the OpenAI SDKs then do not retry); `true` with Retry-After.",
        schema: { enum: ["true", "false"] },
      },
      "Retry-After": {
        description: "Seconds to wait when only Holds of requests in flight block the request.",
        schema: { type: "string", pattern: "^[0-9]+$" },
      },
      Allow: { description: "The methods the route takes.", schema: { type: "string" } },
    },
    responses: errorResponses,
    schemas: {
      ...requestSchemas,
      ...responseSchemas,
      ...adminSchemas,
      ...usageSchemas,
      ErrorEnvelope: errorEnvelopeSchema,
    },
  },
};
