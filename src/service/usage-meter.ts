// The one rule of charging a request (src/budget/README.md, "What a request is charged").
import { ApiError, type ErrorCode } from "../errors/index.js";

/** Errors after which Inference did no work for the request. */
const noWorkCodes: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  "upstream_unavailable",
  "invalid_request",
  "context_length_exceeded",
  "model_not_found",
]);

/**
 * What one request has used so far, in tokens: prompt + tokens generated. Inference's own usage
 * wins where it reports one (each upstream request's `usage.total_tokens`); where it reports none,
 * the prompt tokens as the Hold counted them plus the tokens generated, counted by the gateway
 * from the token ids Inference streams. A streamed capture's replay (one more prefill of prompt +
 * generated − 1 tokens) is added as prompt tokens.
 */
export class UsageMeter {
  /** Tokens generated so far, counted from the token ids of every choice. */
  generated = 0;
  #reported: number | undefined;
  #replay = 0;
  /** Set when Inference served the request without a stream: tokens generated are unknown until it answers. */
  #uncounted = false;

  /** Each prompt's tokens: exact, or a bound until Inference's prompt token ids tell it. */
  readonly #prompts: number[];
  /** Which entries of #prompts are still bounds. */
  readonly #bound: boolean[];
  /** Choices per prompt (choice index = prompt index × n + k). */
  readonly #n: number;
  /** Set when Inference's prompt was longer than its bound (the tokenizer is not what was declared). */
  boundBroken = false;

  /**
   * @param promptTokens Σ prompt tokens as the Hold counts them — or, with `bounds`, ignored.
   * @param bounds Each prompt's bound of its tokens (src/service/count-prompt-tokens.ts) and the
   *   request's n, when the prompts were not counted exactly: the exact counts come from the
   *   prompt token ids Inference streams ({@link notePromptTokens}) or {@link setPromptTokens}.
   */
  constructor(promptTokens: number, bounds?: { readonly perPrompt: readonly number[]; readonly n: number }) {
    this.#prompts = bounds === undefined ? [promptTokens] : [...bounds.perPrompt];
    this.#bound = this.#prompts.map(() => bounds !== undefined);
    this.#n = bounds?.n ?? 1;
  }

  /** Σ prompt tokens: exact where known, else the bound. */
  get promptTokens(): number {
    let sum = 0;
    for (const t of this.#prompts) sum += t;
    return sum;
  }

  /** True once every prompt's tokens are exact (always, without bounds). */
  get promptCounted(): boolean {
    return !this.#bound.includes(true);
  }

  /** The prompt tokens Inference reports for the choice at `choiceIndex` (its prompt_token_ids). */
  notePromptTokens(choiceIndex: number, tokens: number): void {
    const i = Math.floor(choiceIndex / this.#n);
    if (this.#bound[i] !== true) return;
    if (tokens > this.#prompts[i]!) this.boundBroken = true;
    this.#prompts[i] = tokens;
    this.#bound[i] = false;
  }

  /** Each prompt's exact tokens (counted by `/tokenize`), in the request's order. */
  setPromptTokens(perPrompt: readonly number[]): void {
    perPrompt.forEach((tokens, i) => {
      if (this.#bound[i] !== true) return;
      this.#prompts[i] = tokens;
      this.#bound[i] = false;
    });
  }

  /**
   * Whether {@link charge} of `failure` would use prompt tokens that are still a bound: the caller
   * should count them exactly ({@link setPromptTokens}) before charging.
   */
  chargeNeedsPromptCount(failure: unknown): boolean {
    if (this.promptCounted || this.#reported !== undefined) return false;
    return this.charge(failure, 0) !== 0;
  }

  /** Inference's usage of the request (`usage.total_tokens`). */
  report(totalTokens: number): void {
    this.#reported = totalTokens;
  }

  /** Counts generated token ids. */
  addGenerated(tokens: number): void {
    this.generated += tokens;
  }

  /** A streamed capture's replay prefill: its prompt tokens (prompt + generated − 1). */
  addReplay(promptTokens: number): void {
    this.#replay += promptTokens;
  }

  /** The request is served by a non-streamed Inference call whose generated tokens are unknown until it answers. */
  markUncounted(): void {
    this.#uncounted = true;
  }

  /** prompt + generated (+ replay): what a finished request, or one cut short, has used. */
  get used(): number {
    return (this.#reported ?? this.promptTokens + this.generated) + this.#replay;
  }

  /**
   * The charge of a request that ended with `failure` (undefined: it finished, or its caller
   * stopped reading a stream), given `heldTokens`:
   * - a refusal by which Inference did no work (it was unreachable or refused the request before
   *   generating anything): 0;
   * - a non-streamed Inference call cut short by its caller or the deadline before it answered
   *   (prompt_logprobs, capture): its tokens are unknown, and vLLM reports none for an aborted
   *   request, so the whole Hold — else disconnecting would be a way to have work done for free;
   * - otherwise what was used: prompt + generated (+ replay).
   */
  charge(failure: unknown, heldTokens: number): number {
    if (failure === undefined) return this.used;
    const code: ErrorCode = failure instanceof ApiError ? failure.code : "internal_error";
    if (noWorkCodes.has(code) && this.generated === 0 && this.#reported === undefined) return 0;
    if (
      this.#uncounted &&
      this.#reported === undefined &&
      (code === "canceled" || code === "deadline_exceeded")
    ) {
      return Math.max(heldTokens, this.used);
    }
    return this.used;
  }
}
