// The usage a completion reports: Inference's, else the gateway's own count (what it charges), per
// choice for continuous_usage_stats, summed over a fan-out's parts.
import { create } from "@bufbuild/protobuf";
import {
  type CompletionChoice,
  type CreateCompletionRequest,
  type Usage,
  UsageSchema,
} from "../../../gen/acs/v1/completions_pb.js";
import { countPromptTokens } from "../count-prompt-tokens.js";
import type { UsageMeter } from "../usage-meter.js";
import type { Prepared } from "./call-types.js";

/** A Usage of the gateway's own counts ({@link UsageMeter.countedUsage}). */
export function usageOf(counts: ReturnType<UsageMeter["countedUsage"]>): Usage | undefined {
  return counts === undefined ? undefined : create(UsageSchema, counts);
}

/** The sum of several upstream requests' usage (a lens fan-out's usage, proto/API.md §6). */
export function sumUsage(usages: readonly Usage[]): Usage {
  const sum = create(UsageSchema);
  for (const u of usages) {
    sum.promptTokens += u.promptTokens;
    sum.completionTokens += u.completionTokens;
    sum.totalTokens += u.totalTokens;
  }
  return sum;
}

/**
 * The usage of meter part `part` as the gateway counted it ({@link UsageMeter.countedUsage}: what
 * it is charged), for a response whose Inference request reported none. Prompt tokens that are
 * still a bound are counted exactly first (`/tokenize`); undefined when that fails (no number is
 * made up).
 */
export async function countedUsage(
  prepared: Prepared,
  request: CreateCompletionRequest,
  meter: UsageMeter,
  part: number,
  signal: AbortSignal,
): Promise<Usage | undefined> {
  if (!meter.promptCounted) {
    try {
      const { client, servedModelName } = prepared.model;
      meter.setPromptTokens(await countPromptTokens(client, servedModelName, request, signal));
    } catch {
      return undefined;
    }
  }
  return usageOf(meter.countedUsage(part));
}

/**
 * Each choice's usage so far as the gateway counts it, for continuous_usage_stats when Inference
 * sends none: as vLLM counts it, the choice's prompt tokens (its prompt token ids, else its
 * prompt's exact count) and the tokens it generated so far (its token ids).
 */
export class ChoiceCounts {
  readonly #choices = new Map<number, { prompt: number | undefined; generated: number }>();
  readonly #prepared: Prepared;
  readonly #meter: UsageMeter;
  readonly #n: number;

  constructor(prepared: Prepared, meter: UsageMeter, n: number) {
    this.#prepared = prepared;
    this.#meter = meter;
    this.#n = n;
  }

  /** Counts `choice` (a chunk's piece, token ids still on it); its usage so far, undefined while its prompt's tokens are a bound. */
  add(choice: CompletionChoice): Usage | undefined {
    let c = this.#choices.get(choice.index);
    if (c === undefined) {
      c = { prompt: undefined, generated: 0 };
      this.#choices.set(choice.index, c);
    }
    if (choice.promptTokenIds.length > 0) c.prompt = choice.promptTokenIds.length;
    c.generated += choice.tokenIds.length;
    const p = Math.floor(choice.index / this.#n);
    const prompt =
      c.prompt ??
      (this.#prepared.promptBounds === undefined
        ? this.#prepared.promptLengths[p]
        : this.#meter.exactPromptTokens(p));
    if (prompt === undefined) return undefined;
    return create(UsageSchema, {
      promptTokens: prompt,
      completionTokens: c.generated,
      totalTokens: prompt + c.generated,
    });
  }
}
