/**
 * What one request asks of a Budget (proto/API.md §9), all in tokens as the Hold counts them.
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
  /**
   * The request is a streamed capture: after the text, Inference prefills each choice's prompt +
   * generated tokens − 1 once more to read its activations (proto/API.md §6). That replay is held,
   * and charged, as prompt tokens: n × promptTokens + prompts × n × (maxTokens − 1) more.
   * @default false
   */
  readonly captureReplay?: boolean;
  /**
   * `promptTokens` is an upper bound of the prompt tokens (their UTF-8 bytes plus the special
   * tokens added, for a byte-level tokenizer), not Inference's count. Such a demand is held only
   * whole: when it does not fit, nothing is planned (`count`): the caller counts the prompt
   * exactly and asks again, so that a clamp or a refusal is the one the exact count gives.
   * @default false
   */
  readonly promptTokensBound?: boolean;
}

/** The outcome of {@link planHold}: either a Hold to place, or a refusal. */
export type HoldPlan =
  | {
      readonly kind: "hold";
      /** Tokens to hold: {@link demandTokens} of the demand at `maxTokens`. */
      readonly tokens: number;
      /** max_tokens for the request; lower than asked when clamped. */
      readonly maxTokens: number;
      readonly clamped: boolean;
    }
  | {
      readonly kind: "insufficient";
      /** The least the request could run with: {@link demandTokens} at max_tokens 1. */
      readonly minimumTokens: number;
    }
  | {
      /** A demand with a bound of its prompt tokens did not fit whole: count them exactly and plan again. */
      readonly kind: "count";
    };

/**
 * Tokens a request holds at `maxTokens` per choice: promptTokens + prompts × n × maxTokens, plus,
 * for a streamed capture, its replay n × promptTokens + prompts × n × (maxTokens − 1).
 */
export function demandTokens(demand: HoldDemand, maxTokens: number = demand.maxTokens): number {
  const choices = demand.prompts * demand.n;
  const text = demand.promptTokens + choices * maxTokens;
  if (demand.captureReplay !== true) return text;
  return text + demand.n * demand.promptTokens + choices * (maxTokens - 1);
}

/**
 * The Hold for `demand` when `available` tokens are left on the Budget (budget − spent − Σ open
 * Holds; may be negative): the whole demand ({@link demandTokens}) when it fits; else max_tokens
 * lowered to the most that fits (clamped); else, when not even one generated token per choice
 * fits, a refusal. A demand whose promptTokens is a bound ({@link HoldDemand.promptTokensBound})
 * that does not fit whole is neither clamped nor refused: `count`. Pure; every store runs it inside its own transaction. Throws RangeError when a
 * number of `demand` is out of range.
 */
export function planHold(available: number, demand: HoldDemand): HoldPlan {
  checkDemand(demand);
  const need = demandTokens(demand);
  if (need <= available) return { kind: "hold", tokens: need, maxTokens: demand.maxTokens, clamped: false };
  if (demand.promptTokensBound === true) return { kind: "count" };
  // demandTokens is linear in maxTokens: need(m) = base + perToken × m.
  const choices = demand.prompts * demand.n;
  const replay = demand.captureReplay === true ? 1 : 0;
  const perToken = choices * (1 + replay);
  const base = demandTokens(demand, 0);
  const fits = Math.floor((available - base) / perToken);
  if (fits < 1) return { kind: "insufficient", minimumTokens: demandTokens(demand, 1) };
  return { kind: "hold", tokens: demandTokens(demand, fits), maxTokens: fits, clamped: true };
}

/** Throws RangeError unless every number of `demand` is a safe integer in its range. */
export function checkDemand(demand: HoldDemand): void {
  const { promptTokens, prompts, n, maxTokens } = demand;
  checkInt("promptTokens", promptTokens, 0);
  checkInt("prompts", prompts, 1);
  checkInt("n", n, 1);
  checkInt("maxTokens", maxTokens, 1);
  if (!Number.isSafeInteger(demandTokens(demand))) {
    throw new RangeError("Hold demand: the tokens it holds are not a safe integer");
  }
}

function checkInt(name: string, value: number, min: number): void {
  if (!Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`Hold demand: ${name} must be an integer ≥ ${min}, got ${value}`);
  }
}
