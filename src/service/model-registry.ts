import type { ModelConfig } from "../config/index.js";
import { ApiError } from "../errors/index.js";

/** The part of the Inference client the registry needs (src/upstream/vllm). */
export interface ModelsSource {
  listModels(signal?: AbortSignal): Promise<{ data: Array<{ id: string; max_model_len?: number | null }> }>;
}

/** A served model with every fact the service needs, resolved at start. */
export interface ServedModel<Client> {
  readonly id: string;
  readonly aliases: readonly string[];
  readonly servedModelName: string;
  /** Tokens; from the models file, or Inference's /v1/models. */
  readonly maxModelLen: number;
  readonly hiddenSize: number;
  readonly numLayers: number;
  readonly ownedBy: string;
  /** Unix seconds when the gateway started serving it. */
  readonly created: number;
  readonly client: Client;
}

/**
 * The refusal of an unknown model name, the same on every route that takes one (OpenAI's
 * wording): ApiError 404 `model_not_found`, param `model`.
 */
export function modelNotFound(name: string): ApiError {
  return new ApiError(
    "model_not_found",
    `The model \`${name}\` does not exist or you do not have access to it.`,
    {
      param: "model",
    },
  );
}

/** Resolves names (id or alias) to served models. */
export interface ModelRegistry<Client> {
  /** The model for an id or alias; throws ApiError 404 `model_not_found` (param `model`). */
  resolve(name: string): ServedModel<Client>;
  /** Every served model, in configuration order. */
  list(): ServedModel<Client>[];
}

/**
 * Builds the registry: one Inference client per model (`clientFor`), and max_model_len read from
 * Inference's /v1/models where the configuration leaves it out. Throws when Inference does not
 * serve a configured model or does not answer (the caller retries until ready).
 */
export async function createModelRegistry<Client extends ModelsSource>(
  models: readonly ModelConfig[],
  clientFor: (model: ModelConfig) => Client,
  signal?: AbortSignal,
): Promise<ModelRegistry<Client>> {
  const created = Math.floor(Date.now() / 1000);
  const served: ServedModel<Client>[] = [];
  for (const m of models) {
    const client = clientFor(m);
    let maxModelLen = m.maxModelLen;
    if (maxModelLen === undefined) {
      const list = await client.listModels(signal);
      const entry = list.data.find((d) => d.id === m.servedModelName);
      if (entry === undefined) {
        throw new Error(`Inference at ${m.upstreamUrl} does not serve ${m.servedModelName}`);
      }
      if (typeof entry.max_model_len !== "number") {
        throw new Error(
          `Inference at ${m.upstreamUrl} gives no max_model_len for ${m.servedModelName}: set max_model_len`,
        );
      }
      maxModelLen = entry.max_model_len;
    }
    served.push({ ...m, maxModelLen, created, client });
  }
  const byName = new Map<string, ServedModel<Client>>();
  for (const s of served) for (const name of [s.id, ...s.aliases]) byName.set(name, s);
  return {
    resolve(name) {
      const found = byName.get(name);
      if (found === undefined) {
        throw modelNotFound(name);
      }
      return found;
    },
    list: () => [...served],
  };
}
