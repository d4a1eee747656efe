// The error responses of the OpenAPI document (src/surfaces/rest/openapi.ts), derived from the error
// catalogue (src/core/errors/catalogue.ts): each status's codes and OpenAI types, and the envelope.
import { type ErrorCode, errorCatalogue } from "../../core/errors/index.js";
import { type JsonSchema, type OpenApiResponse, orNull, ref } from "./openapi-json-schema.js";

/** Every code a caller can be answered with (`canceled` is never rendered: the caller is gone). */
const renderedCodes = (Object.keys(errorCatalogue) as ErrorCode[]).filter((code) => code !== "canceled");

/** The codes of the catalogue answered with `status`. */
export function errorCodesOfStatus(status: number): ErrorCode[] {
  return renderedCodes.filter((code) => errorCatalogue[code].status === status);
}

/** The HTTP statuses of the error catalogue, ascending. */
export const errorStatuses: readonly number[] = [
  ...new Set(renderedCodes.map((code) => errorCatalogue[code].status)),
].sort((a, b) => a - b);

const statusText: Record<number, string> = {
  400: "Bad request: malformed JSON, an unknown field, a wrong type, a value out of range (proto/API.md §2–§4).",
  401: "The API key is missing or not valid.",
  403: "The key may not use this model, or it is a key of the other kind (an API key on the admin API, an admin key elsewhere).",
  404: "Unknown model, key id or route (the admin API on a gateway without keys too).",
  405: "The route does not take this method (`Allow` lists the ones it takes).",
  413: "The body is over 8 MiB (after Content-Encoding is decoded), or a steering tensor is over its bound.",
  415: "The body is not `application/json`, or its Content-Encoding is not gzip, deflate or br.",
  429: "The key's Budget is spent (`insufficient_quota`, `x-should-retry: false`), or the request must wait (`rate_limited`, `Retry-After`).",
  500: "The gateway had an error.",
  502: "Inference answered with an error of its own.",
  503: "Inference is unavailable, or the gateway is shutting down.",
  504: "The deadline passed (14 minutes without a stream, or the caller's).",
};

/** `ErrorNNN`: the envelope, its `code` and `type` restricted to the catalogue's for `status`. */
function errorResponse(status: number): OpenApiResponse {
  const codes = errorCodesOfStatus(status);
  const types = [...new Set(codes.map((code) => errorCatalogue[code].type))];
  const headers: Record<string, unknown> = { "X-Request-Id": { $ref: "#/components/headers/X-Request-Id" } };
  if (status === 429) {
    headers["x-should-retry"] = { $ref: "#/components/headers/x-should-retry" };
    headers["Retry-After"] = { $ref: "#/components/headers/Retry-After" };
  }
  if (status === 405) headers.Allow = { $ref: "#/components/headers/Allow" };
  return {
    description: `${statusText[status] ?? "Error."} Codes: ${codes.map((c) => `\`${c}\``).join(", ")}.`,
    headers,
    content: {
      "application/json": {
        schema: {
          allOf: [
            ref("ErrorEnvelope"),
            {
              type: "object",
              properties: {
                error: {
                  type: "object",
                  properties: { code: { enum: codes }, type: { enum: types } },
                },
              },
            },
          ],
        },
      },
    },
  };
}

/** A `$ref` to the error response of `status` (`#/components/responses/ErrorNNN`). */
export const errorResponseRef = (status: number) => ({ $ref: `#/components/responses/Error${status}` });

/** The responses of `statuses`, keyed by status, each a `$ref` to its error response. */
export const errorsOf = (...statuses: number[]) =>
  Object.fromEntries(statuses.map((status) => [String(status), errorResponseRef(status)]));

/** The error responses of every status of the catalogue, as `ErrorNNN` components. */
export const errorResponses: Readonly<Record<string, OpenApiResponse>> = Object.fromEntries(
  errorStatuses.map((status) => [`Error${status}`, errorResponse(status)]),
);

/** The envelope of every refusal (proto/API.md §7). */
export const errorEnvelopeSchema: JsonSchema = {
  type: "object",
  description:
    "Every refusal, on every surface (proto/API.md §7). Connect/gRPC carry the same fields as the `acs.v1.ErrorEnvelope` detail.",
  required: ["error", "request_id"],
  additionalProperties: false,
  properties: {
    error: {
      type: "object",
      required: ["message", "type", "param", "code"],
      additionalProperties: false,
      properties: {
        message: { type: "string" },
        type: { enum: [...new Set(renderedCodes.map((code) => errorCatalogue[code].type))] },
        param: orNull({
          type: "string",
          description:
            "The request field at fault (dotted path for nested ones, e.g. `apply_steering_vectors[0].scale`).",
        }),
        code: orNull({ enum: renderedCodes, description: "The gateway always sets one." }),
      },
    },
    request_id: {
      type: "string",
      pattern: "^req_[0-9a-f]{32}$",
      description: "Also the response's X-Request-Id.",
    },
  },
};
