// The one rule of charging a request (src/budget/README.md, "What a request is charged").
import { ApiError, type ErrorCode } from "../core/errors/index.js";

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
  /** Inference's `usage.prompt_tokens` and `completion_tokens` for it, once reported. */
  reportedSplit: { prompt: number; completion: number } | undefined;
  /** Prompt tokens of its streamed capture's replay prefill. */
  replay: number;
  /** Whether its Inference request was sent (a fan-out's parts wait for a free slot). */
  started: boolean;
  /** Served without a stream: its generated tokens are unknown until Inference answers. */
  uncounted: boolean;
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
    // A request sent as one upstream request is under way from the start; the parts of a fan-out
    // (always two or more) each start when a slot is free ({@link markStarted}).
    const started = prompts.length === 1;
    this.#parts = prompts.map((tokens) => ({
      promptTokens: tokens,
      generated: 0,
      reported: undefined,
      reportedSplit: undefined,
      replay: 0,
      started,
      uncounted: false,
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
    let sum = 0;
    for (const p of this.#parts) sum += p.promptTokens;
    return sum;
  }

  /** Tokens generated so far over every part, counted from the token ids of every choice. */
  get generated(): number {
    let sum = 0;
    for (const p of this.#parts) sum += p.generated; // read per streamed chunk: no callback
    return sum;
  }

  /**
   * The usage of part `part` as the gateway counts it, for a response whose Inference request
   * reported none: `prompt_tokens` as the Hold counted them (exact: Inference's prompt token ids,
   * `/tokenize`, or token ids given), `completion_tokens` the generated token ids counted so far,
   * `total_tokens` their sum — what {@link used} charges for the part, a streamed capture's replay
   * aside (proto/API.md §9). Undefined while a prompt's tokens are still a bound: they are not
   * known exactly yet ({@link setPromptTokens}).
   */
  countedUsage(
    part = 0,
  ): { promptTokens: number; completionTokens: number; totalTokens: number } | undefined {
    if (!this.promptCounted) return undefined;
    const p = this.#part(part);
    return {
      promptTokens: p.promptTokens,
      completionTokens: p.generated,
      totalTokens: p.promptTokens + p.generated,
    };
  }

  /**
   * Each prompt's tokens, exact, of a request whose prompts were bounded (`undefined` for a prompt
   * still a bound, and for every prompt without bounds).
   */
  exactPromptTokens(prompt: number): number | undefined {
    if (this.#prompts === undefined || this.#bound[prompt] !== false) return undefined;
    return this.#prompts[prompt];
  }

  /**
   * Inference's usage of part `part`: its `usage` (prompt, completion and total tokens), or only
   * its `total_tokens`.
   */
  report(
    usage:
      | number
      | { readonly promptTokens: number; readonly completionTokens: number; readonly totalTokens: number },
    part = 0,
  ): void {
    const p = this.#part(part);
    if (typeof usage === "number") {
      p.reported = usage;
      p.reportedSplit = undefined;
    } else {
      p.reported = usage.totalTokens;
      p.reportedSplit = { prompt: usage.promptTokens, completion: usage.completionTokens };
    }
  }

  /** Counts generated token ids of part `part`. */
  addGenerated(tokens: number, part = 0): void {
    const p = this.#part(part);
    p.generated += tokens;
    p.started = true;
  }

  /**
   * Part `part`'s Inference request failed over to another replica before its caller saw any of
   * it (a unary call's collected stream): what the first replica generated is not the caller's,
   * so it is not counted — a request is charged the answer it got (proto/API.md §9).
   */
  restart(part = 0): void {
    const p = this.#part(part);
    p.generated = 0;
    p.reported = undefined;
    p.reportedSplit = undefined;
  }

  /** A streamed capture's replay prefill of part `part`: its prompt tokens (prompt + generated − 1). */
  addReplay(promptTokens: number, part = 0): void {
    const p = this.#part(part);
    p.replay += promptTokens;
    p.started = true;
  }

  /** Part `part`'s Inference request is being sent (a fan-out's part that was waiting for a slot). */
  markStarted(part = 0): void {
    this.#part(part).started = true;
  }

  /** Part `part` is served by a non-streamed Inference call whose generated tokens are unknown until it answers. */
  markUncounted(part = 0): void {
    const p = this.#part(part);
    p.started = true;
    p.uncounted = true;
  }

  /** What one part has used: nothing before it was sent; Inference's usage, else prompt + generated; + replay. */
  static #usedBy(p: Part): number {
    if (!p.started && p.reported === undefined) return 0;
    return (p.reported ?? p.promptTokens + p.generated) + p.replay;
  }

  /**
   * prompt + generated (+ replay) over the parts that were sent: what a finished request, or one
   * cut short, has used.
   */
  get used(): number {
    let sum = 0;
    for (const p of this.#parts) sum += UsageMeter.#usedBy(p);
    return sum;
  }

  /** Whether Inference did no work for a request that ended with `failure` (see {@link charge}). */
  #noWork(failure: unknown): boolean {
    const code: ErrorCode = failure instanceof ApiError ? failure.code : "internal_error";
    const noneReported = this.#parts.every((p) => p.reported === undefined);
    return noWorkCodes.has(code) && this.generated === 0 && noneReported;
  }

  /**
   * The usage record's tokens of a request that ended with `failure` (src/budget/usage/usage-record.ts):
   * over the parts that were sent, `input` the prompt tokens (Inference's `prompt_tokens` where it
   * reported them, else as the Hold counted them), `output` the tokens generated (Inference's
   * `completion_tokens`, else the token ids counted), `activation` a streamed capture's replay
   * prefill; all 0 when Inference did no work (charged nothing). input + output is the `usage` the
   * caller was told; input + output + activation what {@link used} charges.
   */
  figures(failure: unknown): { input: number; output: number; activation: number } {
    const sum = { input: 0, output: 0, activation: 0 };
    if (failure !== undefined && this.#noWork(failure)) return sum;
    for (const p of this.#parts) {
      if (!p.started && p.reported === undefined) continue;
      sum.input += p.reportedSplit?.prompt ?? p.promptTokens;
      sum.output += p.reportedSplit?.completion ?? p.generated;
      sum.activation += p.replay;
    }
    return sum;
  }

  /**
   * The charge of a request that ended with `failure` (undefined: it finished, or its caller
   * stopped reading a stream), given `heldTokens`:
   * - a refusal by which Inference did no work (it was unreachable or refused the request before
   *   generating anything, in every part): 0;
   * - a non-streamed Inference call cut short by its caller or the deadline before it answered
   *   (prompt_logprobs, capture): its tokens are unknown, and vLLM reports none for an aborted
   *   request, so the whole Hold — else disconnecting would be a way to have work done for free. In
   *   a fan-out, each such part (sent, not answered) is charged its share of the Hold (Hold ÷
   *   parts) or what it used if more; parts never sent cost nothing; at most the Hold in all;
   * - otherwise what was used: prompt + generated (+ replay), summed over the parts sent.
   */
  charge(failure: unknown, heldTokens: number): number {
    if (failure === undefined) return this.used;
    if (this.#noWork(failure)) return 0;
    const code: ErrorCode = failure instanceof ApiError ? failure.code : "internal_error";
    const cut = code === "canceled" || code === "deadline_exceeded";
    const unanswered = (p: Part) => p.uncounted && p.reported === undefined;
    if (!cut || !this.#parts.some(unanswered)) return this.used;
    if (this.#parts.length === 1) return Math.max(heldTokens, this.used);
    const share = Math.ceil(heldTokens / this.#parts.length);
    let sum = 0;
    for (const p of this.#parts)
      sum += unanswered(p) ? Math.max(share, UsageMeter.#usedBy(p)) : UsageMeter.#usedBy(p);
    return Math.min(heldTokens, sum);
  }
}
