// The paths of the OpenAPI document (src/surfaces/rest/openapi.ts): every REST route, its request body,
// its responses and their headers.
import { errorResponseRef, errorsOf } from "./openapi-errors.js";
import { type OpenApiOperation, ref, requestIdHeader } from "./openapi-json-schema.js";

/** `POST /v1/completions`: JSON, or SSE with `stream: true`. */
const completionsOperation: OpenApiOperation = {
  operationId: "createCompletion",
  tags: ["completions"],
  summary: "Create a completion (JSON, or an SSE stream with `stream: true`)",
  description:
    "OpenAI's completions API for base models, with vLLM's sampling fields and vllm-lens activations (`output_residual_stream`) and steering (`apply_steering_vectors`). Every check runs before the first byte of a stream, so a refusal is a real HTTP status; an error after the stream started is one `data:` event holding the envelope, then `data: [DONE]`. The body may be sent with `Content-Encoding: gzip`, `deflate` or `br` (8 MiB after decoding).",
  requestBody: {
    required: true,
    content: {
      "application/json": {
        schema: ref("CompletionRequest"),
        examples: {
          text: {
            summary: "A completion",
            value: { model: "llama-8b", prompt: "The sky is", max_tokens: 8 },
          },
          stream: {
            summary: "A stream with its usage",
            value: {
              model: "llama-8b",
              prompt: "The sky is",
              max_tokens: 8,
              stream: true,
              stream_options: { include_usage: true },
            },
          },
          activations: {
            summary: "The residual stream of layers 15 and 20",
            value: {
              model: "llama-8b",
              prompt: "The sky is",
              max_tokens: 4,
              output_residual_stream: [15, 20],
            },
          },
        },
      },
    },
  },
  responses: {
    "200": {
      description:
        "The completion; with `stream: true`, `text/event-stream` events (`data: <chunk JSON>` … `data: [DONE]`, and `: keepalive` comments every 5 s; no `event:`, `id:` or `retry:` lines).",
      headers: {
        ...requestIdHeader,
        "X-Acs-Max-Tokens-Clamped": { $ref: "#/components/headers/X-Acs-Max-Tokens-Clamped" },
      },
      content: {
        "application/json": { schema: ref("Completion") },
        "text/event-stream": {
          schema: {
            type: "string",
            description: "Server-sent events; each `data:` is a CompletionStreamEvent, the last is `[DONE]`.",
          },
          "x-sse-data": ref("CompletionStreamEvent"),
        },
      },
    },
    ...errorsOf(400, 401, 403, 404, 413, 415, 429, 500, 502, 503, 504),
  },
};

/** vLLM's `/tokenize` or `/detokenize`: a completion's key and model checks, then Inference. */
function tokensOperation(
  name: "tokenize" | "detokenize",
  summary: string,
  example: unknown,
): OpenApiOperation {
  const type = name === "tokenize" ? "Tokenize" : "Detokenize";
  return {
    operationId: name,
    tags: ["tokens"],
    summary,
    description: `vLLM's route, served by one of the model's replicas (\`acs.v1.CompletionsService/${type}\` on Connect). The key, the body's decoding and the model's checks are a completion's, with the same envelopes; nothing is charged.`,
    requestBody: {
      required: true,
      content: {
        "application/json": {
          schema: ref(`${type}Request`),
          examples: { [name]: { summary, value: example } },
        },
      },
    },
    responses: {
      "200": {
        description: `vLLM's ${type}Response.`,
        headers: requestIdHeader,
        content: { "application/json": { schema: ref(`${type}Response`) } },
      },
      ...errorsOf(400, 401, 403, 404, 413, 415, 500, 502, 503, 504),
    },
  };
}

/** A malformed URL (`/v1/models/%zz`) is 400 on any route; an admin key is 403. */
const modelsErrors = errorsOf(400, 401, 403, 500, 503);

/** Every route of the REST surface, by path and method. */
export const paths: Record<string, Record<string, OpenApiOperation>> = {
  "/v1/completions": { post: completionsOperation },
  "/v1/models": {
    get: {
      operationId: "listModels",
      tags: ["models"],
      summary: "List the models: one entry per id and per alias",
      responses: {
        "200": {
          description: "The models.",
          headers: requestIdHeader,
          content: { "application/json": { schema: ref("ModelList") } },
        },
        ...modelsErrors,
      },
    },
  },
  "/v1/models/{model}": {
    get: {
      operationId: "retrieveModel",
      tags: ["models"],
      summary: "One model, by id or alias",
      parameters: [
        {
          name: "model",
          in: "path",
          required: true,
          description: "A model id or alias; a `/` in it URL-encoded (`%2F`) or not.",
          schema: { type: "string" },
        },
      ],
      responses: {
        "200": {
          description: "The model, named as asked.",
          headers: requestIdHeader,
          content: { "application/json": { schema: ref("Model") } },
        },
        ...modelsErrors,
        "404": errorResponseRef(404),
      },
    },
  },
  "/v1/chat/completions": {
    post: {
      operationId: "createChatCompletion",
      tags: ["completions"],
      summary: "Not served: base models have no chat format (always 400)",
      deprecated: true,
      security: [],
      description:
        "Always 400 `invalid_request`, whatever the body (proto/API.md §8): send `POST /v1/completions` with a prompt.",
      responses: errorsOf(400, 413),
    },
  },
  "/tokenize": {
    post: tokensOperation("tokenize", "A text's token ids (vLLM's /tokenize)", {
      model: "llama-8b",
      prompt: "The sky is",
    }),
  },
  "/detokenize": {
    post: tokensOperation("detokenize", "The text of token ids (vLLM's /detokenize)", {
      model: "llama-8b",
      tokens: [128000, 791, 13180, 374],
    }),
  },
  "/health": {
    get: {
      operationId: "health",
      tags: ["ops"],
      summary: "vLLM's health probe: /readyz's status, with an empty body",
      security: [],
      responses: {
        "200": { description: "Ready: the gateway is serving and a model has a replica up." },
        "503": { description: "Not ready (starting, draining, or no model serves)." },
      },
    },
  },
  "/version": {
    get: {
      operationId: "version",
      tags: ["ops"],
      summary: "vLLM's version route: the gateway's version",
      security: [],
      responses: {
        "200": {
          description: "The gateway's version (its package.json), in vLLM's shape.",
          content: {
            "application/json": {
              schema: {
                type: "object",
                required: ["version"],
                additionalProperties: false,
                properties: { version: { type: "string" } },
              },
            },
          },
        },
      },
    },
  },
  "/healthz": {
    get: {
      operationId: "healthz",
      tags: ["ops"],
      summary: "Liveness: the process answers",
      security: [],
      responses: {
        "200": {
          description: "Alive.",
          content: {
            "application/json": {
              schema: {
                type: "object",
                required: ["status"],
                additionalProperties: false,
                properties: { status: { const: "ok" } },
              },
            },
          },
        },
      },
    },
  },
  "/readyz": {
    get: {
      operationId: "readyz",
      tags: ["ops"],
      summary: "Readiness: a model serves (one of its replicas is up)",
      security: [],
      responses: {
        "200": { description: "Ready.", content: { "application/json": { schema: ref("Readiness") } } },
        "503": { description: "Not ready.", content: { "application/json": { schema: ref("Readiness") } } },
      },
    },
  },
  "/metrics": {
    get: {
      operationId: "metrics",
      tags: ["ops"],
      summary: "Prometheus metrics",
      security: [],
      responses: {
        "200": {
          description: "Prometheus text exposition format.",
          content: { "text/plain": { schema: { type: "string" } } },
        },
      },
    },
  },
  "/openapi.json": {
    get: {
      operationId: "openapi",
      tags: ["ops"],
      summary: "This document",
      security: [],
      responses: {
        "200": {
          description: "The OpenAPI 3.1 document of the REST surface.",
          headers: requestIdHeader,
          content: {
            "application/json": {
              schema: {
                type: "object",
                required: ["openapi", "info", "paths"],
                properties: {
                  openapi: { type: "string" },
                  info: { type: "object" },
                  paths: { type: "object" },
                },
              },
            },
          },
        },
      },
    },
  },
  "/docs": {
    get: {
      operationId: "docs",
      tags: ["ops"],
      summary: "The API reference: this document rendered (Swagger UI, served by the gateway itself)",
      security: [],
      responses: {
        "200": {
          description: "An HTML page.",
          headers: requestIdHeader,
          content: { "text/html": { schema: { type: "string" } } },
        },
      },
    },
  },
};
