import type {
  DetokenizeRequest,
  DetokenizeResponse,
  TokenizeRequest,
  TokenizeResponse,
} from "../../gen/acs/v1/completions_pb.js";
import { toApiError } from "../core/errors/index.js";
import type { Inference } from "../upstream/index.js";
import type { ModelRegistry, ServedModel } from "./model-registry.js";
import type { Ledger } from "./ports.js";
import type { CallContext, CompletionsApi } from "./types.js";
import { validateTokensRequest } from "./validate-request.js";

/** Collaborators of {@link createTokenizeCalls}: those of the completions service. */
export interface TokenizeCallsDeps {
  readonly models: ModelRegistry<Inference>;
  /** The Budget ledger; undefined = keys off (loopback only). */
  readonly ledger: Ledger | undefined;
}

/**
 * Tokenize and Detokenize (vLLM's `/tokenize` and `/detokenize`): a completion's first checks in
 * its order (proto/API.md §3) — key (401), field rules (400), model (404), model allowed for the
 * key (403) — then the call to one of the model's replicas (the pool fails it over as any
 * idempotent call), with the caller's request id. Nothing is held or charged, and the per-key caps
 * on requests in flight do not apply (they count completions).
 */
export function createTokenizeCalls(
  deps: TokenizeCallsDeps,
): Pick<CompletionsApi, "tokenize" | "detokenize"> {
  const { models, ledger } = deps;

  /** The checks both calls run; the served model, or the refusal (its code recorded). */
  async function check(
    request: TokenizeRequest | DetokenizeRequest,
    ctx: CallContext,
  ): Promise<ServedModel<Inference>> {
    const key = ledger === undefined ? undefined : await ledger.authenticate(ctx.authorization);
    if (key !== undefined && ctx.record !== undefined) ctx.record.keyName = key.name ?? key.id;
    validateTokensRequest(request);
    const model = models.resolve(request.model);
    if (ctx.record !== undefined) ctx.record.model = model.id;
    if (key !== undefined) await ledger?.checkModel(key, model.id, model.aliases);
    return model;
  }

  /** `step`, with the code of its refusal recorded for the access log and the metrics. */
  async function recorded<T>(ctx: CallContext, step: () => Promise<T>): Promise<T> {
    try {
      return await step();
    } catch (err) {
      if (ctx.record !== undefined) ctx.record.errorCode = toApiError(err).code;
      throw err;
    }
  }

  return {
    tokenize: (request, ctx) =>
      recorded(ctx, async (): Promise<TokenizeResponse> => {
        const model = await check(request, ctx);
        return await model.client.tokenizeText(model.servedModelName, request, {
          signal: ctx.signal,
          upstreamRequestId: ctx.requestId,
        });
      }),
    detokenize: (request, ctx) =>
      recorded(ctx, async (): Promise<DetokenizeResponse> => {
        const model = await check(request, ctx);
        return await model.client.detokenize(model.servedModelName, request, {
          signal: ctx.signal,
          upstreamRequestId: ctx.requestId,
        });
      }),
  };
}
