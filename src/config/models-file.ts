import { z } from "zod";
import { ConfigError } from "./config-error.js";
import { formatIssues } from "./format-issues.js";

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

/** A replica as the schema gives it (the file's snake_case keys). */
type UpstreamEntry = z.output<typeof upstreamSchema>;
/** A model as the schema gives it (the file's snake_case keys). */
type ModelEntry = z.output<typeof modelSchema>;

/** One replica of a model: an Inference server (vLLM's OpenAI-compatible server) that runs it. */
function toUpstreamConfig(u: Pick<UpstreamEntry, "url" | "api_key" | "weight">) {
  return {
    /** Base URL of the replica, without `/v1`, e.g. `http://10.0.0.5:8000` (a path prefix is kept). */
    url: u.url,
    /** Bearer key for the replica's `--api-key`, if any. */
    apiKey: u.api_key,
    /** Its share of the model's requests relative to the other replicas. @default 1 */
    weight: u.weight ?? 1,
  };
}

/** One model the gateway serves, and where Inference runs it. */
function toModelConfig(m: ModelEntry) {
  const aliases: readonly string[] = m.aliases ?? [];
  // upstream_url (one replica) is set when upstreams is not: the schema checks it.
  const upstreams: readonly UpstreamConfig[] = (
    m.upstreams ?? [{ url: m.upstream_url ?? "", api_key: m.upstream_api_key }]
  ).map(toUpstreamConfig);
  return {
    /** The canonical id callers see, e.g. `meta-llama/Llama-3.1-8B`. */
    id: m.id,
    /** Other names the model answers to, e.g. `llama-8b`. @default [] */
    aliases,
    /** The replicas that run it (at least one; each URL once). */
    upstreams,
    /** The model name Inference serves it under. @default id */
    servedModelName: m.served_model_name ?? m.id,
    /** Longest prompt + completion in tokens; read from Inference's /v1/models when undefined. */
    maxModelLen: m.max_model_len ?? undefined,
    /** Residual stream width (last dim of steering vectors), e.g. 4096 for Llama-3.1-8B. */
    hiddenSize: m.hidden_size,
    /** Decoder layers, e.g. 32 for Llama-3.1-8B. */
    numLayers: m.num_hidden_layers,
    /** `owned_by` in /v1/models. @default "acs" */
    ownedBy: m.owned_by ?? "acs",
    /**
     * Concurrent completions each replica accepts (vLLM's own queue is behind it): the gateway
     * opens up to this many connections per replica, and no more. undefined = the client's
     * default, DEFAULT_MAX_CONCURRENT_COMPLETIONS (16384: enough for 10,000 streams).
     */
    maxConcurrentRequests: m.max_concurrent_requests,
    /**
     * The model's tokenizer is a byte-level BPE without a normalizer (Llama 3, GPT-2 families): a
     * text prompt is never more tokens than its UTF-8 bytes plus the special tokens added (BOS),
     * so the gateway skips `/tokenize` when that bound decides (src/service/count-prompt-tokens.ts).
     * Leave it off for a SentencePiece tokenizer or one that normalizes (NFC, NFKC): text can grow.
     * @default false
     */
    byteLevelTokenizer: m.byte_level_tokenizer ?? false,
  };
}

/** One replica of a model, as the models file gives it, defaults filled in. */
export type UpstreamConfig = Readonly<ReturnType<typeof toUpstreamConfig>>;
/** The keys a model given in code (the embedded engine's, a test's) may leave out: undefined = their default. */
type LeftOut = "maxConcurrentRequests" | "byteLevelTokenizer";
/**
 * One model the gateway serves, as the models file gives it, defaults filled in (a model given in
 * code may leave out the keys of the tuning flags).
 */
export type ModelConfig = Readonly<
  Omit<ReturnType<typeof toModelConfig>, LeftOut> & Partial<Pick<ReturnType<typeof toModelConfig>, LeftOut>>
>;

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
  return parsed.data.models.map(toModelConfig);
}
