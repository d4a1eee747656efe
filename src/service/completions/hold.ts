// A completion's Hold while it runs and when it ends: whether it still stands before each delivery,
// its renewal during a stream, and the one settle to the usage meter's charge.

import type { CreateCompletionRequest } from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../core/errors/index.js";
import { countPromptTokens } from "../count-prompt-tokens.js";
import type { CallContext } from "../types.js";
import type { UsageMeter } from "../usage-meter.js";
import { endRunning, recordTokens } from "./call-record.js";
import type { Prepared } from "./call-types.js";
import type { Hold } from "./check-order.js";
import { endRate } from "./rate-limits.js";
import type { ServiceEnv } from "./service-env.js";
import { logUsage, type UsageEnd } from "./usage-entry.js";

/** A signal that never aborts (a count made after the caller went away). */
const neverAborted = new AbortController().signal;

/**
 * Settles a Hold to `used` tokens (a no-op without one), then hands the request's usage record to
 * the usage log. The one place a Hold ends.
 */
export async function settle(
  env: ServiceEnv,
  hold: Hold | undefined,
  used: number,
  ctx: CallContext,
  end: Omit<UsageEnd, "usedTokens" | "settled">,
): Promise<void> {
  const { ledger } = env;
  if (hold === undefined || ledger === undefined) return;
  let settled: unknown;
  try {
    settled = await ledger.settle(hold.id, used);
  } catch (err) {
    // The Hold stays open and expires (reclaimed); the caller's answer is already decided.
    env.onLedgerError(err);
  }
  logUsage(env, hold, ctx, { ...end, usedTokens: used, settled });
}

/**
 * `true` when the request's Hold still covers what it may deliver (always without a Hold, and
 * with one in the usual case: no promise is made); else a promise that resolves once the ledger
 * confirmed it, or rejects with ApiError 429 `insufficient_quota` when the Budget no longer holds
 * it ({@link Ledger.standing}). Asked before each chunk of a stream and before a non-streamed
 * answer: nothing is delivered that the Budget does not cover.
 */
export function holdStands(env: ServiceEnv, hold: Hold | undefined): true | Promise<void> {
  const { ledger } = env;
  if (hold === undefined || ledger === undefined) return true;
  const standing = ledger.standing(hold.id);
  if (standing === true) return true;
  return standing.then((stands) => {
    if (!stands) {
      throw new ApiError(
        "insufficient_quota",
        "You exceeded your current quota: the key's Budget no longer holds the tokens of this request " +
          "(this gateway replica could not renew its Hold on them in time, and they were given back " +
          "to the Budget for other requests).",
      );
    }
  });
}

/**
 * Renews a stream's Hold once per renew interval, recording the tokens used so far (what a
 * reclaim after a crash charges), without holding up its chunks.
 */
export function holdRenewer(env: ServiceEnv, hold: Hold | undefined, meter: UsageMeter): () => void {
  const { ledger } = env;
  let last = Date.now();
  return () => {
    if (hold === undefined || ledger === undefined || Date.now() - last < env.renewEveryMs) return;
    last = Date.now();
    const used = meter.used;
    Promise.resolve()
      .then(() => ledger.renew(hold.id, used))
      .catch(env.onLedgerError);
  };
}

/**
 * The tokens to charge a request that ended with `failure` ({@link UsageMeter.charge}). When the
 * charge would use prompt tokens that are still a bound (a stream cut short before Inference
 * told its prompt), they are counted exactly first (`/tokenize`, without the caller's signal,
 * which may have aborted); should that fail, the bound stays (the charge never exceeds the Hold).
 */
async function chargeOf(
  env: ServiceEnv,
  prepared: Prepared,
  request: CreateCompletionRequest,
  meter: UsageMeter,
  failure: unknown,
): Promise<number> {
  if (meter.boundBroken && !env.boundBroken.has(prepared.model)) {
    env.boundBroken.add(prepared.model);
    process.emitWarning(
      `model ${prepared.model.id}: a prompt had more tokens than its UTF-8 bytes + special tokens; byte_level_tokenizer is wrong for it, prompts are counted by /tokenize from now on`,
    );
  }
  if (prepared.hold !== undefined && meter.chargeNeedsPromptCount(failure)) {
    try {
      const { client, servedModelName } = prepared.model;
      meter.setPromptTokens(await countPromptTokens(client, servedModelName, request, neverAborted));
    } catch {
      // Inference is unreachable: the bound stays.
    }
  }
  return meter.charge(failure, prepared.hold?.tokens ?? 0);
}

/**
 * The end of every completion that reached Inference: counts its charge ({@link chargeOf}),
 * records its tokens for the access line and the metrics, ends {@link CallRecord.running} (also
 * when counting throws), then settles its Hold (and logs its usage record).
 */
export async function chargeAndSettle(
  env: ServiceEnv,
  prepared: Prepared,
  request: CreateCompletionRequest,
  meter: UsageMeter,
  failure: unknown,
  ctx: CallContext,
): Promise<void> {
  let charge: number;
  try {
    charge = await chargeOf(env, prepared, request, meter, failure);
    recordTokens(ctx, meter);
  } finally {
    endRunning(ctx);
  }
  await endRate(prepared.rate, charge, env.onLedgerError);
  await settle(env, prepared.hold, charge, ctx, {
    model: prepared.model.id,
    failure,
    tokens: meter.figures(failure),
  });
}
