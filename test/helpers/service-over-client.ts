import type { BudgetLedger } from "../../src/budget/index.js";
import {
  type CompletionsApi,
  createCompletionsService,
  createModelRegistry,
} from "../../src/service/index.js";
import { type VllmClient, VllmInference } from "../../src/upstream/index.js";
import { memoryModel } from "./memory-service.js";

/**
 * The completions service over one model `m` (served as `served`, max_model_len 4096, 2 layers of
 * hidden size 8) whose every replica is `client` — a scripted Inference for service tests — with
 * keys and Budgets on `ledger` (undefined: keys off) and a 60 s non-stream deadline.
 */
export function serviceOverClient(
  client: VllmClient & { serving(): boolean },
  ledger: BudgetLedger | undefined,
): CompletionsApi {
  return createCompletionsService({
    models: createModelRegistry([memoryModel], () => new VllmInference(client)),
    ledger,
    nonStreamDeadlineMs: 60_000,
  });
}
