import { z } from "zod";
import { ConfigError } from "./config-error.js";
import { formatIssues } from "./format-issues.js";
import type { ModelConfig } from "./model-config.js";

const name = z.string({ error: "must be a string" }).min(1, { error: "must not be empty" });

const positiveInt = z
  .int({ error: "must be a positive integer" })
  .min(1, { error: "must be a positive integer" });

const httpUrl = z.string({ error: "must be a string" }).refine(
  (text) => {
    try {
      const url = new URL(text);
      return (url.protocol === "http:" || url.protocol === "https:") && url.username === "";
    } catch {
      return false;
    }
  },
  { error: "must be an http:// or https:// URL (without credentials: use api_key)" },
);

/** A URL as compared for duplicates (normalised by WHATWG URL, no trailing slash). */
function sameUrl(text: string): string {
  try {
    return new URL(text).href.replace(/\/+$/, "");
  } catch {
    return text;
  }
}

/** One replica: `{"url", "api_key"?, "weight"?}`. */
const upstreamSchema = z.strictObject({
  url: httpUrl,
  api_key: name.optional(),
  weight: z
    .int({ error: "must be an integer from 1 to 1000" })
    .min(1, { error: "must be an integer from 1 to 1000" })
    .max(1000, { error: "must be an integer from 1 to 1000" })
    .optional(),
});

/** One model of the models file (snake_case, as in vLLM's and OpenAI's JSON). */
const modelSchema = z
  .strictObject({
    id: name,
    aliases: z.array(name, { error: "must be an array of names" }).optional(),
    upstream_url: httpUrl.optional(),
    upstream_api_key: name.optional(),
    upstreams: z
      .array(upstreamSchema, { error: "must be an array of {url, api_key?, weight?}" })
      .min(1, { error: "must list at least one upstream" })
      .optional(),
    served_model_name: name.optional(),
    // null reads as "not set": Inference's /v1/models tells it.
    max_model_len: positiveInt.nullable().optional(),
    hidden_size: positiveInt,
    num_hidden_layers: positiveInt,
    owned_by: name.optional(),
    max_concurrent_requests: positiveInt.optional(),
    byte_level_tokenizer: z.boolean({ error: "must be true or false" }).optional(),
  })
  .superRefine((m, ctx) => {
    if ((m.upstream_url === undefined) === (m.upstreams === undefined)) {
      ctx.addIssue({
        code: "custom",
        path: [],
        message: "needs exactly one of upstream_url (one replica) and upstreams (a list of replicas)",
      });
    }
    if (m.upstreams !== undefined && m.upstream_api_key !== undefined) {
      ctx.addIssue({
        code: "custom",
        path: ["upstream_api_key"],
        message: "goes with upstream_url; with upstreams, give each its api_key",
      });
    }
    const seen = new Set<string>();
    for (const [i, u] of (m.upstreams ?? []).entries()) {
      const key = sameUrl(u.url);
      if (seen.has(key))
        ctx.addIssue({ code: "custom", path: ["upstreams", i, "url"], message: "is listed twice" });
      seen.add(key);
    }
  });

const modelsFileSchema = z
  .strictObject({
    models: z
      .array(modelSchema, { error: "must be an array of models" })
      .min(1, { error: "must list at least one model" }),
  })
  .superRefine((file, ctx) => {
    const seen = new Set<string>();
    for (const [i, m] of file.models.entries()) {
      for (const n of [m.id, ...(m.aliases ?? [])]) {
        if (seen.has(n))
          ctx.addIssue({ code: "custom", path: ["models", i], message: `uses the name ${n} twice` });
        seen.add(n);
      }
    }
  });

/** The keys allowed at a path of the models file, for the message about an unknown one. */
function allowedKeys(path: readonly PropertyKey[]): readonly string[] {
  if (path.length === 0) return Object.keys(modelsFileSchema.shape);
  if (path.length === 2) return Object.keys(modelSchema.shape);
  if (path.length === 4) return Object.keys(upstreamSchema.shape);
  return [];
}

/**
 * Parses a models file, checked against its schema (zod; unknown keys are refused):
 * `{"models": [{"id", "aliases"?, "upstream_url" | "upstreams": [{"url", "api_key"?, "weight"?}],
 * "upstream_api_key"? (with upstream_url), "served_model_name"?, "max_model_len"?, "hidden_size",
 * "num_hidden_layers", "owned_by"?, "max_concurrent_requests"?, "byte_level_tokenizer"?}]}`. `upstream_url` is the shorthand of one replica.
 * Throws ConfigError, one line naming the file, the entry and the key at fault.
 */
export function parseModelsFile(text: string, source: string): ModelConfig[] {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`${source}: not JSON (${(err as Error).message})`);
  }
  const parsed = modelsFileSchema.safeParse(json, { reportInput: true });
  if (!parsed.success) throw new ConfigError(`${source}: ${formatIssues(parsed.error.issues, allowedKeys)}`);
  return parsed.data.models.map((m) => ({
    id: m.id,
    aliases: m.aliases ?? [],
    // upstream_url (one replica) is set when upstreams is not: the schema checks it.
    upstreams: (m.upstreams ?? [{ url: m.upstream_url ?? "", api_key: m.upstream_api_key }]).map((u) => ({
      url: u.url,
      apiKey: u.api_key,
      weight: u.weight ?? 1,
    })),
    servedModelName: m.served_model_name ?? m.id,
    maxModelLen: m.max_model_len ?? undefined,
    hiddenSize: m.hidden_size,
    numLayers: m.num_hidden_layers,
    ownedBy: m.owned_by ?? "acs",
    maxConcurrentRequests: m.max_concurrent_requests,
    byteLevelTokenizer: m.byte_level_tokenizer ?? false,
  }));
}
