// The usage record of a request that had a Hold, handed to the UsageLog port once its Hold is
// settled (src/budget/README.md, "Usage records"): the one place a record is made.
import { toApiError } from "../../core/errors/index.js";
import type { CallContext } from "../types.js";
import type { Hold } from "./check-order.js";
import type { ServiceEnv } from "./service-env.js";

/**
 * The status of a request's outcome: 200 for an answer, else its error's HTTP status (the
 * catalogue's) — also for a stream that ended with an error event after its 200 status line, and
 * 499 (`canceled`, nginx's "client closed request") when its caller went away first.
 */
export function outcomeStatus(failure: unknown): number {
  return failure === undefined ? 200 : toApiError(failure).status;
}

/** What a request's end tells its usage record. */
export interface UsageEnd {
  /** The served model's id. */
  readonly model: string;
  /** Why it ended, if it failed. */
  readonly failure: unknown;
  /** Its tokens ({@link UsageMeter.figures}); zeros for a request refused before Inference. */
  readonly tokens: { readonly input: number; readonly output: number; readonly activation: number };
  /** The tokens its settle was asked to charge. */
  readonly usedTokens: number;
  /** What the settle answered; undefined when it threw. */
  readonly settled: unknown;
}

/** Hands the record of a settled request to the usage log (nothing without a Hold or a log). */
export function logUsage(env: ServiceEnv, hold: Hold | undefined, ctx: CallContext, end: UsageEnd): void {
  if (hold === undefined || env.usageLog === undefined) return;
  env.usageLog.record({
    keyId: hold.keyId,
    model: end.model,
    inputTokens: end.tokens.input,
    outputTokens: end.tokens.output,
    activationTokens: end.tokens.activation,
    status: outcomeStatus(end.failure),
    requestId: ctx.requestId,
    settled: end.settled,
    usedTokens: end.usedTokens,
    heldTokens: hold.tokens,
  });
}
