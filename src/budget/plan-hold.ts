/**
 * What one request asks of a Budget (API.md §9), all in tokens as the Hold counts them.
 */
export interface HoldDemand {
  /** Σ of the prompt tokens over every prompt of the request; integer ≥ 0. */
  readonly promptTokens: number;
  /** Number of prompts; integer ≥ 1. */
  readonly prompts: number;
  /** Choices per prompt (`n`); integer ≥ 1. */
  readonly n: number;
  /** Generated tokens per choice asked for (`max_tokens`, or its §3 default); integer ≥ 1. */
  readonly maxTokens: number;
}

/** The outcome of {@link planHold}: either a Hold to place, or a refusal. */
export type HoldPlan =
  | {
      readonly kind: "hold";
      /** Tokens to hold: promptTokens + prompts × n × maxTokens. */
      readonly tokens: number;
      /** max_tokens for the request; lower than asked when clamped. */
      readonly maxTokens: number;
      readonly clamped: boolean;
    }
  | {
      readonly kind: "insufficient";
      /** The least the request could run with: promptTokens + prompts × n × 1. */
      readonly minimumTokens: number;
    };

/**
 * The Hold for `demand` when `available` tokens are left on the Budget (budget − spent − Σ open
 * Holds; may be negative). The whole demand, promptTokens + prompts × n × maxTokens, when it
 * fits; else max_tokens lowered to ⌊(available − promptTokens) / (prompts × n)⌋ (clamped); else,
 * when not even one generated token per choice fits, a refusal. Pure; every store runs it inside
 * its own transaction. Throws RangeError when a number of `demand` is out of range.
 */
export function planHold(available: number, demand: HoldDemand): HoldPlan {
  checkDemand(demand);
  const perToken = demand.prompts * demand.n;
  const need = demand.promptTokens + perToken * demand.maxTokens;
  if (need <= available) return { kind: "hold", tokens: need, maxTokens: demand.maxTokens, clamped: false };
  const fits = Math.floor((available - demand.promptTokens) / perToken);
  if (fits < 1) return { kind: "insufficient", minimumTokens: demand.promptTokens + perToken };
  return { kind: "hold", tokens: demand.promptTokens + perToken * fits, maxTokens: fits, clamped: true };
}

/** Throws RangeError unless every number of `demand` is a safe integer in its range. */
export function checkDemand(demand: HoldDemand): void {
  const { promptTokens, prompts, n, maxTokens } = demand;
  checkInt("promptTokens", promptTokens, 0);
  checkInt("prompts", prompts, 1);
  checkInt("n", n, 1);
  checkInt("maxTokens", maxTokens, 1);
  if (!Number.isSafeInteger(promptTokens + prompts * n * maxTokens)) {
    throw new RangeError("Hold demand: promptTokens + prompts × n × maxTokens is not a safe integer");
  }
}

function checkInt(name: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`Hold demand: ${name} must be an integer ≥ ${min}, got ${value}`);
  }
}
