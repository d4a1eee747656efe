import type { BudgetLedger } from "../../src/budget/index.js";
import type { ModelConfig } from "../../src/config/index.js";
import {
  type CompletionsApi,
  createCompletionsService,
  createModelRegistry,
} from "../../src/service/index.js";
import { type VllmClient, VllmInference } from "../../src/upstream/index.js";

/**
 * The completions service over one model `m` (served as `served`, max_model_len 4096, 2 layers of
 * hidden size 8) whose every replica is `client` — a scripted Inference for service tests — with
 * keys and Budgets on `ledger` (undefined: keys off) and a 60 s non-stream deadline.
 */
export function serviceOverClient(
  client: VllmClient & { serving(): boolean },
  ledger: BudgetLedger | undefined,
): CompletionsApi {
  const model = {
    id: "m",
    aliases: [],
    upstreams: [{ url: "http://127.0.0.1:1", weight: 1 }],
    servedModelName: "served",
    maxModelLen: 4096,
    hiddenSize: 8,
    numLayers: 2,
    ownedBy: "acs",
  } as unknown as ModelConfig;
  return createCompletionsService({
    models: createModelRegistry([model], () => new VllmInference(client)),
    ledger,
    nonStreamDeadlineMs: 60_000,
  });
}
