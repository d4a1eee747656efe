import type { ModelConfig } from "../config/index.js";
import { ApiError } from "../core/errors/index.js";
import { DEFAULT_MAX_CONCURRENT_COMPLETIONS } from "../upstream/index.js";

/** The part of an Inference server's client the registry's replica check needs (src/upstream). */
export interface ModelsSource {
  listModels(signal?: AbortSignal): Promise<{ data: Array<{ id: string; max_model_len?: number | null }> }>;
}

/** The part of a model's upstream (src/upstream/pool) the registry needs. */
export interface ModelUpstream {
  /** True while at least one replica of the model is up. */
  serving(): boolean;
}

/**
 * The check a replica passes before it gets requests (src/upstream/pool calls it at start and each
 * time the replica comes back): its `/v1/models` lists the model's served name, with the model's
 * max_model_len. Throws an Error saying what the replica serves instead.
 */
export type AdmitReplica = (replica: ModelsSource, signal: AbortSignal) => Promise<void>;

/** A served model with every fact the service needs. */
export interface ServedModel<Client> {
  readonly id: string;
  readonly aliases: readonly string[];
  readonly servedModelName: string;
  /** Tokens; from the models file, or Inference's /v1/models. */
  readonly maxModelLen: number;
  readonly hiddenSize: number;
  readonly numLayers: number;
  readonly ownedBy: string;
  /** A text prompt is at most its UTF-8 bytes + the special tokens added (src/config: ModelConfig). */
  readonly byteLevelTokenizer?: boolean | undefined;
  /** Unix seconds when the gateway knew every fact of it. */
  readonly created: number;
  /**
   * Concurrent completions all its replicas take: Σ over its replicas of `max_concurrent_requests`
   * (default 16,384 each). A key may hold a share of it (src/service/admission.ts).
   */
  readonly upstreamCapacity: number;
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

/** Whether each configured model can take requests now. */
export interface ModelStatus {
  readonly id: string;
  /** Its facts are known and at least one replica is up. */
  readonly serving: boolean;
}

/** Resolves names (id or alias) to served models. */
export interface ModelRegistry<Client> {
  /**
   * The model for an id or alias. Throws ApiError 404 `model_not_found` (param `model`) for an
   * unknown name; 503 `upstream_unavailable` for a configured model whose max_model_len is not
   * known yet (no replica has answered since start).
   */
  resolve(name: string): ServedModel<Client>;
  /** Every model whose facts are known, in configuration order. */
  list(): ServedModel<Client>[];
  /** Every configured model and whether it serves, in configuration order. */
  status(): ModelStatus[];
}

/**
 * Builds the registry: one upstream per model (`upstreamFor`, given the check its replicas must
 * pass), and max_model_len from the models file or else from the first replica that passes the
 * check. A model whose upstream is down or serves another model does not hold up the others: it
 * is served once a replica passes (the pool checks again with backoff). Replicas of one model must
 * agree on max_model_len; one that does not is kept out.
 */
export function createModelRegistry<Client extends ModelUpstream>(
  models: readonly ModelConfig[],
  upstreamFor: (model: ModelConfig, admit: AdmitReplica) => Client,
): ModelRegistry<Client> {
  interface Entry {
    readonly config: ModelConfig;
    readonly client: Client;
    /** Undefined until max_model_len is known. */
    served: ServedModel<Client> | undefined;
  }
  const entries: Entry[] = [];
  const byName = new Map<string, Entry>();

  const serve = (entry: Entry, maxModelLen: number): void => {
    const { upstreams, ...facts } = entry.config;
    const perReplica = facts.maxConcurrentRequests ?? DEFAULT_MAX_CONCURRENT_COMPLETIONS;
    entry.served = {
      ...facts,
      maxModelLen,
      created: Math.floor(Date.now() / 1000),
      upstreamCapacity: perReplica * upstreams.length,
      client: entry.client,
    };
  };

  for (const m of models) {
    // The replicas' check runs only after upstreamFor returned (the pool checks asynchronously).
    const holder: { entry?: Entry } = {};
    const admit: AdmitReplica = async (replica, signal) => {
      const list = await replica.listModels(signal);
      const found = list.data.find((d) => d.id === m.servedModelName);
      if (found === undefined) {
        const names = list.data.map((d) => d.id);
        throw new Error(
          `it serves ${names.length === 0 ? "no model" : names.join(", ")}, not ${m.servedModelName} (model ${m.id})`,
        );
      }
      const entry = holder.entry;
      if (m.maxModelLen !== undefined || entry === undefined) return;
      const len = found.max_model_len;
      if (typeof len !== "number" || !Number.isInteger(len) || len < 1) {
        throw new Error(
          `it gives no max_model_len for ${m.servedModelName}: set max_model_len in the models file`,
        );
      }
      if (entry.served === undefined) serve(entry, len);
      else if (entry.served.maxModelLen !== len) {
        throw new Error(
          `it serves ${m.servedModelName} with max_model_len ${len}, the model's other replicas ${entry.served.maxModelLen}`,
        );
      }
    };
    const entry: Entry = { config: m, client: upstreamFor(m, admit), served: undefined };
    holder.entry = entry;
    if (m.maxModelLen !== undefined) serve(entry, m.maxModelLen);
    entries.push(entry);
    for (const name of [m.id, ...m.aliases]) byName.set(name, entry);
  }

  return {
    resolve(name) {
      const entry = byName.get(name);
      if (entry === undefined) throw modelNotFound(name);
      if (entry.served === undefined) {
        throw new ApiError(
          "upstream_unavailable",
          `The model \`${name}\` is not available yet: Inference has not answered since the gateway started.`,
        );
      }
      return entry.served;
    },
    list: () => entries.flatMap((e) => (e.served === undefined ? [] : [e.served])),
    status: () =>
      entries.map((e) => ({ id: e.config.id, serving: e.served !== undefined && e.client.serving() })),
  };
}
