// GET /v1/admin/usage/completions in the OpenAPI document (src/surfaces/rest/openapi.ts): OpenAI's
// completions Usage API — its query parameters and its page of buckets (src/budget/usage/usage-query.ts).
import { errorsOf } from "./openapi-errors.js";
import { type JsonSchema, type OpenApiOperation, ref, requestIdHeader } from "./openapi-json-schema.js";

const seconds = (description: string): JsonSchema => ({ type: "integer", minimum: 0, description });
const count = { type: "integer", minimum: 0 } as const;
const nothing = { type: "null" } as const;
const idOrNull = (description: string): JsonSchema => ({ type: ["string", "null"], description });

/** The usage route's component schemas. */
export const usageSchemas: Record<string, JsonSchema> = {
  UsageCompletionsResult: {
    type: "object",
    additionalProperties: false,
    required: ["object", "input_tokens", "output_tokens", "num_model_requests", "api_key_id", "model"],
    properties: {
      object: { const: "organization.usage.completions.result" },
      input_tokens: count,
      output_tokens: count,
      input_cached_tokens: count,
      input_audio_tokens: count,
      output_audio_tokens: count,
      num_model_requests: count,
      project_id: nothing,
      user_id: nothing,
      api_key_id: idOrNull("The key's id when grouped by `api_key_id`, else null."),
      model: idOrNull("The served model's id when grouped by `model`, else null."),
      batch: nothing,
      service_tier: nothing,
    },
  },
  UsageBucket: {
    type: "object",
    additionalProperties: false,
    required: ["object", "start_time", "end_time", "results"],
    properties: {
      object: { const: "bucket" },
      start_time: seconds("Start of the bucket, Unix seconds (UTC-aligned)."),
      end_time: seconds("End of the bucket, exclusive, Unix seconds."),
      results: { type: "array", items: ref("UsageCompletionsResult") },
    },
  },
  UsageCompletionsPage: {
    type: "object",
    additionalProperties: false,
    required: ["object", "data", "has_more", "next_page"],
    properties: {
      object: { const: "page" },
      data: { type: "array", items: ref("UsageBucket") },
      has_more: { type: "boolean" },
      next_page: { type: ["string", "null"], description: "Pass as `page` for the next page." },
    },
  },
};

const list = (name: string, description: string) => ({
  name,
  in: "query",
  description,
  style: "form",
  explode: true,
  schema: { type: "array", items: { type: "string" } },
});

/** The usage route's path. */
export const usagePaths: Record<string, Record<string, OpenApiOperation>> = {
  "/v1/admin/usage/completions": {
    get: {
      operationId: "usageCompletions",
      tags: ["admin"],
      summary: "Completions usage in time buckets (OpenAI's Usage API)",
      security: [{ adminKey: [] }],
      parameters: [
        {
          name: "start_time",
          in: "query",
          required: true,
          schema: seconds("Start, inclusive, Unix seconds."),
        },
        { name: "end_time", in: "query", schema: seconds("End, exclusive, Unix seconds (default now).") },
        {
          name: "bucket_width",
          in: "query",
          schema: { type: "string", enum: ["1m", "1h", "1d"], default: "1d" },
        },
        list("group_by", "`api_key_id` and/or `model`."),
        list("api_key_ids", "Only these keys."),
        list("models", "Only these models."),
        {
          name: "limit",
          in: "query",
          description: "Buckets per page: default 60 / 24 / 7, at most 1440 / 168 / 31 (1m / 1h / 1d).",
          schema: { type: "integer", minimum: 1, maximum: 1440 },
        },
        {
          name: "page",
          in: "query",
          description: "The `next_page` of the previous page.",
          schema: { type: "string" },
        },
      ],
      responses: {
        "200": {
          description: "The page of buckets.",
          headers: requestIdHeader,
          content: { "application/json": { schema: ref("UsageCompletionsPage") } },
        },
        ...errorsOf(400, 401, 403, 404, 500, 503),
      },
    },
  },
};
