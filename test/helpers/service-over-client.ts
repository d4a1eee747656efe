import type { BudgetLedger } from "../../src/budget/index.js";
import { createSteeringBudget } from "../../src/lens/index.js";
import {
  type CompletionsApi,
  createAdmission,
  createCompletionsService,
  createModelRegistry,
} from "../../src/service/index.js";
import { type VllmClient, VllmInference } from "../../src/upstream/index.js";
import { admissionDefaults, configDefaults, steeringDefaults } from "./config-defaults.js";
import { memoryModel } from "./memory-service.js";

/**
 * The completions service over one model `m` (served as `served`, max_model_len 4096, 2 layers of
 * hidden size 8) whose every replica is `client` — a scripted Inference for service tests — with
 * keys and Budgets on `ledger` (undefined: keys off) and a 60 s non-stream deadline; every other
 * setting at the configuration's default (./config-defaults.ts).
 */
export function serviceOverClient(
  client: VllmClient & { serving(): boolean },
  ledger: BudgetLedger | undefined,
): CompletionsApi {
  return createCompletionsService({
    models: createModelRegistry([memoryModel], () => new VllmInference(client)),
    ledger,
    nonStreamDeadlineMs: 60_000,
    holdRenewIntervalMs: configDefaults.holdRenewMs,
    lensFanOutConcurrency: configDefaults.lensFanOutConcurrency,
    steeringBudget: createSteeringBudget(steeringDefaults),
    admission: createAdmission(admissionDefaults),
  });
}
