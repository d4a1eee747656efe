// The completions service: the one implementation behind REST and Connect.
import { createTokenizeCalls } from "../tokenize-calls.js";
import type { CompletionsApi } from "../types.js";
import { authenticate, listModels } from "./list-models.js";
import { type CompletionsServiceDeps, serviceEnv } from "./service-env.js";
import { streamCompletion } from "./stream.js";
import { createCompletion } from "./unary.js";

export type { CompletionsServiceDeps } from "./service-env.js";

/**
 * The completions service. `prepare` runs the contract's checks in its order (proto/API.md §3,
 * ./check-order.ts), all before Inference sees the request; then the request runs against its
 * model's Inference port (./unary.ts, ./stream.ts), and its Hold is settled exactly once, in one
 * place, by one rule (./hold.ts, the usage meter).
 */
export function createCompletionsService(deps: CompletionsServiceDeps): CompletionsApi {
  const env = serviceEnv(deps);
  return {
    authenticate: async (ctx) => {
      await authenticate(env, ctx);
    },
    createCompletion: (request, ctx) => createCompletion(env, request, ctx),
    streamCompletion: (request, ctx) => streamCompletion(env, request, ctx),
    listModels: (ctx) => listModels(env, ctx),
    ...createTokenizeCalls({ models: deps.models, ledger: deps.ledger }),
  };
}
