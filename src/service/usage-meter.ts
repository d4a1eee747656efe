// The one rule of charging a request (src/budget/README.md, "What a request is charged").
import { ApiError, type ErrorCode } from "../errors/index.js";

/** Errors after which Inference did no work for the request. */
const noWorkCodes: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  "upstream_unavailable",
  "invalid_request",
  "context_length_exceeded",
  "model_not_found",
]);

/** Σ of a list of token counts. */
function sum(counts: readonly number[]): number {
  let total = 0;
  for (const c of counts) total += c;
  return total;
}

/** What one upstream request of a request has used so far. */
interface Part {
  /** Its prompt tokens as the Hold counts them (exact once Inference tells a bounded prompt). */
  promptTokens: number;
  /** Tokens generated, counted from the token ids of its choices. */
  generated: number;
  /** Inference's `usage.total_tokens` for it, once reported. */
  reported: number | undefined;
  /** Prompt tokens of its streamed capture's replay prefill. */
  replay: number;
}

/**
 * What one request has used so far, in tokens: prompt + tokens generated, summed over its upstream
 * requests ("parts": one, or one per choice in a lens fan-out, proto/API.md §6). Inference's own
 * usage wins where it reports one (each upstream request's `usage.total_tokens`); where it reports
 * none, the part's prompt tokens as the Hold counted them plus the tokens generated, counted by the
 * gateway from the token ids Inference streams. A streamed capture's replay (one more prefill of
 * prompt + generated − 1 tokens) is added as prompt tokens.
 */
export class UsageMeter {
  readonly #parts: Part[];
  /** Set when Inference served the request without a stream: tokens generated are unknown until it answers. */
  #uncounted = false;

  /**
   * Each prompt's tokens of a request sent as one upstream request whose prompts were bounded
   * (exact, or a bound until Inference's prompt token ids tell it); undefined without bounds.
   */
  readonly #prompts: number[] | undefined;
  /** Which entries of #prompts are still bounds. */
  readonly #bound: boolean[];
  /** Choices per prompt (choice index = prompt index × n + k). */
  readonly #n: number;
  /** Set when Inference's prompt was longer than its bound (the tokenizer is not what was declared). */
  boundBroken = false;

  /**
   * @param promptTokens Σ prompt tokens as the Hold counts them: one number for a request sent as
   *   one upstream request, or one per part (upstream request) of a fan-out, in part order.
   * @param bounds Each prompt's bound of its tokens (src/service/count-prompt-tokens.ts) and the
   *   request's n, when the prompts of a one-part request were not counted exactly (`promptTokens`
   *   is then ignored): the exact counts come from the prompt token ids Inference streams
   *   ({@link notePromptTokens}) or {@link setPromptTokens}.
   */
  constructor(
    promptTokens: number | readonly number[],
    bounds?: { readonly perPrompt: readonly number[]; readonly n: number },
  ) {
    this.#prompts = bounds === undefined ? undefined : [...bounds.perPrompt];
    this.#bound = this.#prompts?.map(() => true) ?? [];
    this.#n = bounds?.n ?? 1;
    const prompts =
      this.#prompts !== undefined
        ? [sum(this.#prompts)]
        : typeof promptTokens === "number"
          ? [promptTokens]
          : promptTokens;
    this.#parts = prompts.map((tokens) => ({
      promptTokens: tokens,
      generated: 0,
      reported: undefined,
      replay: 0,
    }));
  }

  /** True once every prompt's tokens are exact (always, without bounds). */
  get promptCounted(): boolean {
    return !this.#bound.includes(true);
  }

  /** The prompt tokens Inference reports for the choice at `choiceIndex` (its prompt_token_ids). */
  notePromptTokens(choiceIndex: number, tokens: number): void {
    const prompts = this.#prompts;
    const i = Math.floor(choiceIndex / this.#n);
    if (prompts === undefined || this.#bound[i] !== true) return;
    if (tokens > (prompts[i] ?? 0)) this.boundBroken = true;
    prompts[i] = tokens;
    this.#bound[i] = false;
    this.#part(0).promptTokens = sum(prompts);
  }

  /** Each prompt's exact tokens (counted by `/tokenize`), in the request's order. */
  setPromptTokens(perPrompt: readonly number[]): void {
    const prompts = this.#prompts;
    if (prompts === undefined) return;
    perPrompt.forEach((tokens, i) => {
      if (this.#bound[i] !== true) return;
      prompts[i] = tokens;
      this.#bound[i] = false;
    });
    this.#part(0).promptTokens = sum(prompts);
  }

  /**
   * Whether {@link charge} of `failure` would use prompt tokens that are still a bound: the caller
   * should count them exactly ({@link setPromptTokens}) before charging.
   */
  chargeNeedsPromptCount(failure: unknown): boolean {
    if (this.promptCounted || this.#parts.every((p) => p.reported !== undefined)) return false;
    return this.charge(failure, 0) !== 0;
  }

  #part(part: number): Part {
    const p = this.#parts[part];
    if (p === undefined) throw new RangeError(`UsageMeter: no part ${part}`);
    return p;
  }

  /** Σ prompt tokens over the parts, as the Hold counts them. */
  get promptTokens(): number {
    return this.#parts.reduce((sum, p) => sum + p.promptTokens, 0);
  }

  /** Tokens generated so far over every part, counted from the token ids of every choice. */
  get generated(): number {
    return this.#parts.reduce((sum, p) => sum + p.generated, 0);
  }

  /** Inference's usage of part `part` (its `usage.total_tokens`). */
  report(totalTokens: number, part = 0): void {
    this.#part(part).reported = totalTokens;
  }

  /** Counts generated token ids of part `part`. */
  addGenerated(tokens: number, part = 0): void {
    this.#part(part).generated += tokens;
  }

  /** A streamed capture's replay prefill of part `part`: its prompt tokens (prompt + generated − 1). */
  addReplay(promptTokens: number, part = 0): void {
    this.#part(part).replay += promptTokens;
  }

  /** The request is served by non-streamed Inference calls whose generated tokens are unknown until they answer. */
  markUncounted(): void {
    this.#uncounted = true;
  }

  /** prompt + generated (+ replay) over the parts: what a finished request, or one cut short, has used. */
  get used(): number {
    return this.#parts.reduce((sum, p) => sum + (p.reported ?? p.promptTokens + p.generated) + p.replay, 0);
  }

  /**
   * The charge of a request that ended with `failure` (undefined: it finished, or its caller
   * stopped reading a stream), given `heldTokens`:
   * - a refusal by which Inference did no work (it was unreachable or refused the request before
   *   generating anything, in every part): 0;
   * - a non-streamed Inference call cut short by its caller or the deadline before it answered
   *   (prompt_logprobs, capture; in a fan-out, any part without an answer): its tokens are unknown,
   *   and vLLM reports none for an aborted request, so the whole Hold — else disconnecting would be
   *   a way to have work done for free;
   * - otherwise what was used: prompt + generated (+ replay), summed over the parts.
   */
  charge(failure: unknown, heldTokens: number): number {
    if (failure === undefined) return this.used;
    const code: ErrorCode = failure instanceof ApiError ? failure.code : "internal_error";
    const noneReported = this.#parts.every((p) => p.reported === undefined);
    if (noWorkCodes.has(code) && this.generated === 0 && noneReported) return 0;
    if (
      this.#uncounted &&
      this.#parts.some((p) => p.reported === undefined) &&
      (code === "canceled" || code === "deadline_exceeded")
    ) {
      return Math.max(heldTokens, this.used);
    }
    return this.used;
  }
}
