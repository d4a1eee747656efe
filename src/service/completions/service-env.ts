// The completions service's collaborators and settings. Its settings come resolved (the defaults
// of configurable ones live in src/config/env-schema.ts alone); only a few hooks default here.
import type { SteeringBudget } from "../../lens/index.js";
import type { RateLimitStore } from "../../ratelimit/index.js";
import type { Inference } from "../../upstream/index.js";
import type { Admission } from "../admission.js";
import { createSpecialTokenCounter } from "../count-prompt-tokens.js";
import type { ModelRegistry, ServedModel } from "../model-registry.js";
import type { Ledger, UsageLog } from "../ports.js";
import { type CheckEnv, type CheckStep, checkOrder } from "./check-order.js";

/** Collaborators of the completions service. */
export interface CompletionsServiceDeps {
  /** The served models, each with its Inference port (src/upstream/port.ts). */
  readonly models: ModelRegistry<Inference>;
  /** The Budget ledger; undefined = keys and Budgets off (loopback only). */
  readonly ledger: Ledger | undefined;
  /** Longest wait for a non-streamed answer, ms (ACS_DEADLINE_MS; proto/API.md §5: 14 minutes). */
  readonly nonStreamDeadlineMs: number;
  /** Where each settled request's record goes (the ledger's usage log); undefined: none kept. */
  readonly usageLog?: UsageLog | undefined;
  /**
   * The rate-limit windows of keys with limits (src/ratelimit: memory, or Redis shared by every
   * process); undefined: no rate limits.
   */
  readonly rateLimits?: RateLimitStore | undefined;
  /** How often a stream renews its Hold, ms (ACS_HOLD_RENEW_MS). */
  readonly holdRenewIntervalMs: number;
  /** Told of a ledger call that failed after the response was decided (renew, settle). @default process.emitWarning */
  readonly onLedgerError?: (err: unknown) => void;
  /**
   * Bytes of decoded steering tensors in flight (429/413 past it): createSteeringBudget with
   * ACS_STEERING_REQUEST_BYTES and ACS_STEERING_PROCESS_BYTES (its gauges are on /metrics).
   */
  readonly steeringBudget: SteeringBudget;
  /** Inference requests one lens fan-out (proto/API.md §6) runs at once (ACS_FANOUT_CONCURRENCY). */
  readonly lensFanOutConcurrency: number;
  /**
   * Per-key caps on requests in flight (429 `rate_limited` past them); they apply to keys only,
   * so not with keys off: createAdmission with the configuration's caps, or a cluster worker's.
   */
  readonly admission: Admission;
  /**
   * The check order's steps, run in this order (a test wraps one to fail a call at that step).
   * @default checkOrder (proto/API.md §3)
   */
  readonly checkOrder?: readonly CheckStep[];
}

/** The service's settings and collaborators, every default resolved. */
export interface ServiceEnv {
  readonly models: ModelRegistry<Inference>;
  readonly ledger: Ledger | undefined;
  /** Where each settled request's record goes; undefined: none kept. */
  readonly usageLog: UsageLog | undefined;
  /** Longest wait for a non-streamed answer, ms. */
  readonly nonStreamDeadlineMs: number;
  /** How often a stream renews its Hold, ms. */
  readonly renewEveryMs: number;
  /** Inference requests one lens fan-out runs at once. */
  readonly fanOutConcurrency: number;
  readonly steeringBudget: SteeringBudget;
  readonly admission: Admission;
  readonly onLedgerError: (err: unknown) => void;
  /** Models whose prompts came back longer than their bound: counted exactly from then on. */
  readonly boundBroken: WeakSet<ServedModel<Inference>>;
  /** What the check order's steps use. */
  readonly checks: CheckEnv;
  /** The check order's steps. */
  readonly steps: readonly CheckStep[];
}

/** {@link ServiceEnv} of `deps`, its hooks' defaults filled in. */
export function serviceEnv(deps: CompletionsServiceDeps): ServiceEnv {
  const { models, ledger, admission } = deps;
  const fanOutConcurrency = deps.lensFanOutConcurrency;
  const boundBroken = new WeakSet<ServedModel<Inference>>();
  return {
    models,
    ledger,
    usageLog: deps.usageLog,
    nonStreamDeadlineMs: deps.nonStreamDeadlineMs,
    renewEveryMs: deps.holdRenewIntervalMs,
    fanOutConcurrency,
    steeringBudget: deps.steeringBudget,
    admission,
    onLedgerError:
      deps.onLedgerError ?? ((err: unknown) => process.emitWarning(`Budget ledger: ${String(err)}`)),
    boundBroken,
    checks: {
      models,
      ledger,
      admission,
      rateLimits: deps.rateLimits,
      fanOutConcurrency,
      specialTokens: createSpecialTokenCounter(),
      boundBroken,
    },
    steps: deps.checkOrder ?? checkOrder,
  };
}
