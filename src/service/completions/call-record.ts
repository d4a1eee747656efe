// What a completion records on its call's CallRecord (src/core: the access line, the metrics):
// when it runs, its first token, its error code and its tokens. A call without a record (a test's
// context) records nothing.
import { type ApiError, toApiError } from "../../core/errors/index.js";
import type { CallContext } from "../types.js";
import type { UsageMeter } from "../usage-meter.js";

/** Records the moment Inference's first generated token arrived (once). */
export function markFirstToken(ctx: CallContext): void {
  if (ctx.record !== undefined && ctx.record.firstTokenAt === undefined) {
    ctx.record.firstTokenAt = performance.now();
  }
}

/** The call has passed its checks and runs against Inference ({@link CallRecord.running}). */
export function startRunning(ctx: CallContext): void {
  if (ctx.record !== undefined) ctx.record.running = true;
}

/** The call's tokens are recorded: whoever waits for them ({@link CallRecord.onEnd}) goes on. */
export function endRunning(ctx: CallContext): void {
  const record = ctx.record;
  if (record === undefined || record.running !== true) return;
  record.running = false;
  const onEnd = record.onEnd;
  delete record.onEnd;
  onEnd?.();
}

/** Records the code of the error a call ends with; returns the error. */
export function recordError(ctx: CallContext, err: ApiError): ApiError {
  if (ctx.record !== undefined) ctx.record.errorCode = err.code;
  return err;
}

/** `step`'s result; a refusal's code recorded on the way out. */
export async function recorded<T>(ctx: CallContext, step: Promise<T>): Promise<T> {
  try {
    return await step;
  } catch (err) {
    recordError(ctx, toApiError(err));
    throw err;
  }
}

/** Records the prompt and completion tokens of a call that reached Inference. */
export function recordTokens(ctx: CallContext, meter: UsageMeter): void {
  if (ctx.record === undefined) return;
  ctx.record.promptTokens = meter.promptTokens;
  ctx.record.completionTokens = meter.generated;
}
