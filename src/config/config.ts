import { readFileSync } from "node:fs";

/** One model the gateway serves, and where Inference runs it. */
export interface ModelConfig {
  /** The canonical id callers see, e.g. `meta-llama/Llama-3.1-8B`. */
  readonly id: string;
  /** Other names the model answers to, e.g. `llama-8b`. @default [] */
  readonly aliases: readonly string[];
  /** Base URL of Inference (vLLM's OpenAI-compatible server), e.g. `http://10.0.0.5:8000`. */
  readonly upstreamUrl: string;
  /** The model name Inference serves it under. @default id */
  readonly servedModelName: string;
  /** Bearer key for Inference's `--api-key`, if any. */
  readonly upstreamApiKey: string | undefined;
  /** Longest prompt + completion in tokens; read from Inference's /v1/models when undefined. */
  readonly maxModelLen: number | undefined;
  /** Residual stream width (last dim of steering vectors), e.g. 4096 for Llama-3.1-8B. */
  readonly hiddenSize: number;
  /** Decoder layers, e.g. 32 for Llama-3.1-8B. */
  readonly numLayers: number;
  /** `owned_by` in /v1/models. @default "acs" */
  readonly ownedBy: string;
}

/** The embedded reference engine that `npm start` runs when no models file is given. */
export interface EmbeddedEngineConfig {
  /** Engine preset (src/engine). @default "llama-8b" */
  readonly preset: "tiny" | "llama-8b";
  /** Aliases of the embedded model. @default ["llama-8b"] for that preset */
  readonly aliases: readonly string[];
}

/** The whole configuration, parsed once at start (nothing else reads process.env). */
export interface Config {
  /** Bind address. @default "127.0.0.1" (env HOST) */
  readonly host: string;
  /** TCP port for REST, Connect, gRPC-Web and gRPC. @default 8080 (env PORT) */
  readonly port: number;
  /** Served models (env ACS_MODELS = path of a JSON models file); empty with an embedded engine. */
  readonly models: readonly ModelConfig[];
  /** Set when the gateway starts the reference engine itself (no ACS_MODELS). */
  readonly embeddedEngine: EmbeddedEngineConfig | undefined;
  /** SQLite file of keys and Budgets; undefined = authentication off (loopback only). (env ACS_DB) */
  readonly dbPath: string | undefined;
  /** SSE `: keepalive` interval, ms. @default 5000 (env ACS_KEEPALIVE_MS) */
  readonly keepaliveIntervalMs: number;
  /** Longest wait for a non-streamed answer, ms. @default 840000 (14 min) (env ACS_DEADLINE_MS) */
  readonly nonStreamDeadlineMs: number;
  /** pino level. @default "info" (env ACS_LOG_LEVEL) */
  readonly logLevel: string;
  /**
   * Most bytes of decoded steering tensors one request may hold (elements × 2 or 4 bytes, whatever
   * the compression); more → 413 `request_too_large`. @default 33554432 (32 MiB: 2^23 float32)
   * (env ACS_STEERING_REQUEST_BYTES)
   */
  readonly steeringRequestBytes: number;
  /**
   * Most bytes of decoded steering tensors all requests in flight may hold together; past it →
   * 429 `rate_limited` with `Retry-After: 1`. @default 268435456 (256 MiB) (env ACS_STEERING_PROCESS_BYTES)
   */
  readonly steeringProcessBytes: number;
}

/** The limits and defaults of the API's contract (docs/API.md §3–§5): their one home. */
export const limits = {
  /** prompts × n × max_tokens ≤ this, tokens (§3). */
  maxGeneratedTokens: 32_000,
  /** max_tokens above this needs `stream` (the 14-minute wait), tokens (§3). */
  maxNonStreamTokens: 15_600,
  /** Largest request body on every route, bytes: 8 MiB; larger → 413 (§4). */
  bodyLimitBytes: 8 * 1024 * 1024,
  /** Longest wait for a non-streamed answer, ms: 14 minutes, then 504 (§5). */
  nonStreamDeadlineMs: 14 * 60 * 1000,
  /** Interval of a stream's `: keepalive` comments, ms (§5). */
  keepaliveIntervalMs: 5000,
  /**
   * Default bytes of decoded steering tensors one request may hold: 32 MiB, what the most numbers
   * a request may send (2^23, MAX_STEERING_NUMBERS in src/lens) take as float32 (§6).
   */
  steeringRequestBytes: 2 ** 23 * 4,
  /** Default bytes of decoded steering tensors all requests may hold at once: 256 MiB (§6). */
  steeringProcessBytes: 256 * 2 ** 20,
} as const;

class ConfigError extends Error {
  override readonly name = "ConfigError";
}

function int(
  env: Record<string, string | undefined>,
  name: string,
  fallback: number,
  min: number,
  max: number,
): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  if (!/^\d+$/.test(raw)) throw new ConfigError(`${name} must be an integer, got ${JSON.stringify(raw)}`);
  const value = Number(raw);
  if (value < min || value > max) throw new ConfigError(`${name} must be in [${min}, ${max}], got ${value}`);
  return value;
}

function str(o: Record<string, unknown>, key: string, where: string): string {
  const v = o[key];
  if (typeof v !== "string" || v === "") throw new ConfigError(`${where}.${key} must be a non-empty string`);
  return v;
}

function optPositiveInt(o: Record<string, unknown>, key: string, where: string): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1)
    throw new ConfigError(`${where}.${key} must be a positive integer`);
  return v;
}

/**
 * Parses a models file: `{"models": [{"id", "aliases"?, "upstream_url", "served_model_name"?,
 * "upstream_api_key"?, "max_model_len"?, "hidden_size", "num_hidden_layers", "owned_by"?}]}`.
 * Throws ConfigError naming the bad entry.
 */
export function parseModelsFile(text: string, source: string): ModelConfig[] {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`${source}: not JSON (${(err as Error).message})`);
  }
  const list = (json as { models?: unknown } | null)?.models;
  if (!Array.isArray(list) || list.length === 0)
    throw new ConfigError(`${source}: "models" must be a non-empty array`);
  const seen = new Set<string>();
  return list.map((entry: unknown, i) => {
    const where = `${source}: models[${i}]`;
    if (typeof entry !== "object" || entry === null) throw new ConfigError(`${where} must be an object`);
    const o = entry as Record<string, unknown>;
    const aliases = o.aliases ?? [];
    if (!Array.isArray(aliases) || !aliases.every((a) => typeof a === "string" && a !== "")) {
      throw new ConfigError(`${where}.aliases must be an array of strings`);
    }
    const id = str(o, "id", where);
    for (const name of [id, ...aliases]) {
      if (seen.has(name)) throw new ConfigError(`${where}: the name ${name} is used twice`);
      seen.add(name);
    }
    const hiddenSize = optPositiveInt(o, "hidden_size", where);
    const numLayers = optPositiveInt(o, "num_hidden_layers", where);
    if (hiddenSize === undefined || numLayers === undefined) {
      throw new ConfigError(
        `${where}: hidden_size and num_hidden_layers are required (lens checks need them)`,
      );
    }
    const upstreamUrl = str(o, "upstream_url", where);
    try {
      new URL(upstreamUrl);
    } catch {
      throw new ConfigError(`${where}.upstream_url is not a URL`);
    }
    return {
      id,
      aliases: aliases as string[],
      upstreamUrl,
      servedModelName: typeof o.served_model_name === "string" ? o.served_model_name : id,
      upstreamApiKey: typeof o.upstream_api_key === "string" ? o.upstream_api_key : undefined,
      maxModelLen: optPositiveInt(o, "max_model_len", where),
      hiddenSize,
      numLayers,
      ownedBy: typeof o.owned_by === "string" ? o.owned_by : "acs",
    };
  });
}

/**
 * Reads the configuration from the environment (and the models file it names). Called once, by
 * src/main.ts. Throws ConfigError with a message fit for the operator.
 */
export function loadConfig(env: Record<string, string | undefined> = process.env): Config {
  const modelsPath = env.ACS_MODELS;
  const models = modelsPath ? parseModelsFile(readFileSync(modelsPath, "utf8"), modelsPath) : [];
  const preset = env.ACS_ENGINE_PRESET ?? "llama-8b";
  if (preset !== "tiny" && preset !== "llama-8b")
    throw new ConfigError("ACS_ENGINE_PRESET must be tiny or llama-8b");
  const embeddedEngine: EmbeddedEngineConfig | undefined =
    models.length === 0 ? { preset, aliases: preset === "llama-8b" ? ["llama-8b"] : ["tiny"] } : undefined;
  const dbPath = env.ACS_DB && env.ACS_DB !== "" ? env.ACS_DB : undefined;
  const host = env.HOST && env.HOST !== "" ? env.HOST : "127.0.0.1";
  if (dbPath === undefined && !isLoopback(host)) {
    throw new ConfigError(
      `HOST=${host} without keys: set ACS_DB to a keys database (npm run keys) before binding beyond loopback`,
    );
  }
  const config: Config = {
    host,
    port: int(env, "PORT", 8080, 0, 65535),
    models,
    embeddedEngine,
    dbPath,
    keepaliveIntervalMs: int(env, "ACS_KEEPALIVE_MS", limits.keepaliveIntervalMs, 10, 3_600_000),
    nonStreamDeadlineMs: int(env, "ACS_DEADLINE_MS", limits.nonStreamDeadlineMs, 10, 24 * 3_600_000),
    logLevel: env.ACS_LOG_LEVEL ?? "info",
    steeringRequestBytes: int(env, "ACS_STEERING_REQUEST_BYTES", limits.steeringRequestBytes, 1, 2 ** 40),
    steeringProcessBytes: int(env, "ACS_STEERING_PROCESS_BYTES", limits.steeringProcessBytes, 1, 2 ** 40),
  };
  return Object.freeze(config);
}

/** True for loopback bind addresses (127.0.0.0/8, ::1, localhost). */
export function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host);
}

export { ConfigError };
