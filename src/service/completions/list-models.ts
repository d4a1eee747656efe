// ListModels (GET /v1/models): the served models a key may use.
import { create } from "@bufbuild/protobuf";
import {
  type ListModelsResponse,
  ListModelsResponseSchema,
  ModelSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../core/errors/index.js";
import type { Inference } from "../../upstream/index.js";
import type { ServedModel } from "../model-registry.js";
import type { KeyInfo } from "../ports.js";
import type { CallContext } from "../types.js";
import { recorded } from "./call-record.js";
import type { ServiceEnv } from "./service-env.js";

/** The caller's key (undefined with keys off); throws ApiError 401 `invalid_api_key`. */
export async function authenticate(env: ServiceEnv, ctx: CallContext): Promise<KeyInfo | undefined> {
  return env.ledger === undefined ? undefined : await env.ledger.authenticate(ctx.authorization);
}

/** Whether `key` may use `model` (keys off: every model); other ledger errors are thrown. */
async function mayUse(
  env: ServiceEnv,
  key: KeyInfo | undefined,
  model: ServedModel<Inference>,
): Promise<boolean> {
  if (key === undefined || env.ledger === undefined) return true;
  try {
    await env.ledger.checkModel(key, model.id, model.aliases);
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.code === "model_not_allowed") return false;
    throw err;
  }
}

/**
 * The models the caller may use: a key with an allow-list sees the models it may use (by id or
 * alias), as OpenAI lists a key's models; `GET /v1/models/{id}` of another is then 404
 * `model_not_found`. Throws ApiError 401 `invalid_api_key`.
 */
export async function listModels(env: ServiceEnv, ctx: CallContext): Promise<ListModelsResponse> {
  const key = await recorded(ctx, authenticate(env, ctx));
  if (key !== undefined && ctx.record !== undefined) ctx.record.keyName = key.name ?? key.id;
  const visible: ServedModel<Inference>[] = [];
  for (const m of env.models.list()) if (await mayUse(env, key, m)) visible.push(m);
  return create(ListModelsResponseSchema, {
    data: visible.map((m) =>
      create(ModelSchema, {
        id: m.id,
        created: BigInt(m.created),
        ownedBy: m.ownedBy,
        aliases: [...m.aliases],
        maxModelLen: m.maxModelLen,
        hiddenSize: m.hiddenSize,
        numHiddenLayers: m.numLayers,
      }),
    ),
  });
}
