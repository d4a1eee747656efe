// Prepare and begin a completion: the check order run on a draft, its decisions made the call's
// Prepared, and the running call's meter and one end.
import type { CreateCompletionRequest } from "../../../gen/acs/v1/completions_pb.js";
import { noAdmission } from "../admission.js";
import { fanOutParts } from "../lens-fan-out.js";
import type { CallContext } from "../types.js";
import { UsageMeter } from "../usage-meter.js";
import { CallDeadline } from "./call-deadline.js";
import { CallEnd } from "./call-end.js";
import { recorded, startRunning } from "./call-record.js";
import type { Prepared, RunningCall } from "./call-types.js";
import { type Draft, newDraft, runChecks } from "./check-order.js";
import { chargeAndSettle, settle } from "./hold.js";
import { endRate } from "./rate-limits.js";
import type { ServiceEnv } from "./service-env.js";

/** The usage record's tokens of a request refused before Inference: none. */
const NO_TOKENS = { input: 0, output: 0, activation: 0 } as const;

/** The ids of one request's upstream calls (see {@link Prepared.nextUpstreamId}). */
function upstreamIds(requestId: string): () => string {
  let n = 0;
  return () => (++n === 1 ? requestId : `${requestId}-${n}`);
}

/** Σ of a list of token counts. */
function sum(counts: readonly number[]): number {
  let total = 0;
  for (const c of counts) total += c;
  return total;
}

/**
 * Runs the check order (./check-order.ts) on a draft with a fresh steering lease, and turns what
 * it decided into the call's Prepared; a refusal releases the lease and the admission ticket (and
 * settles a Hold already placed to 0).
 */
async function prepare(
  env: ServiceEnv,
  request: CreateCompletionRequest,
  ctx: CallContext,
  stream: boolean,
): Promise<Prepared> {
  const draft = newDraft(request, ctx, stream, env.steeringBudget.lease(), noAdmission);
  try {
    await runChecks(draft, env.checks, env.steps);
    return preparedOf(draft);
  } catch (err) {
    // Refused: nothing reached Inference, a Hold already placed is settled to 0 (and logged).
    const end = { model: draft.model?.id ?? request.model, failure: err, tokens: NO_TOKENS };
    await new CallEnd({ steering: draft.steeringLease, admission: draft.ticket }, async () => {
      await endRate(draft.rate, 0, env.onLedgerError);
      await settle(env, draft.hold, 0, ctx, end);
    }).end(err);
    throw err;
  }
}

/** The call's Prepared from a draft every check passed: the Inference request (and a fan-out's parts). */
function preparedOf(draft: Draft): Prepared {
  const { request, ctx, shape, hold, maxTokens } = draft;
  const model = draft.model;
  const lengths = draft.lengths;
  if (model === undefined || lengths === undefined) throw new Error("unreachable: the checks did not run");
  const minTokens = request.minTokens === undefined ? undefined : Math.min(request.minTokens, maxTokens);
  const body = model.client.prepare({
    request: minTokens === request.minTokens ? request : { ...request, minTokens },
    servedModelName: model.servedModelName,
    maxTokens,
    stream: draft.stream,
    numLayers: model.numLayers,
    steering: draft.steering,
  });
  const parts = draft.fanOut ? fanOutParts(model.client, body, shape) : undefined;
  ctx.onPrepared?.();
  return {
    model,
    body,
    promptTokens: parts === undefined ? [sum(lengths)] : parts.map((part) => lengths[part.prompt] ?? 0),
    promptBounds: draft.bounds,
    promptLengths: lengths,
    parts,
    capture: request.outputResidualStream !== undefined,
    hold,
    rate: draft.rate,
    steering: draft.steeringLease,
    nextUpstreamId: upstreamIds(ctx.requestId),
    ctx,
    admission: draft.ticket,
  };
}

/** The meter of a prepared request: its prompt tokens exact, or bounds until Inference tells them. */
function newMeter(prepared: Prepared, request: CreateCompletionRequest): UsageMeter {
  return prepared.promptBounds === undefined
    ? new UsageMeter(prepared.promptTokens)
    : new UsageMeter(prepared.promptTokens, { perPrompt: prepared.promptBounds, n: request.n ?? 1 });
}

/**
 * A call that passed its checks, running: its Prepared, its usage meter, a non-streamed call's
 * one deadline (`env.nonStreamDeadlineMs` from here, ./call-deadline.ts), and its one end
 * ({@link CallEnd}: the deadline stopped, lease and ticket released, the Hold settled to the
 * meter's charge).
 */
export async function begin(
  env: ServiceEnv,
  request: CreateCompletionRequest,
  ctx: CallContext,
  stream: boolean,
): Promise<RunningCall> {
  const prepared = await recorded(ctx, prepare(env, request, ctx, stream));
  if (stream) ctx.record?.streamStarted?.();
  startRunning(ctx);
  const meter = newMeter(prepared, request);
  const deadline = stream ? undefined : new CallDeadline(ctx.signal, env.nonStreamDeadlineMs);
  const held = { steering: prepared.steering, admission: prepared.admission, deadline };
  const call = new CallEnd(held, (failure) => chargeAndSettle(env, prepared, request, meter, failure, ctx));
  return { prepared, meter, signal: deadline?.signal ?? ctx.signal, deadline, call };
}

/** A fan-out's parts run at once: the concurrency, at most what the key's share admitted. */
export function partsAtOnce(env: ServiceEnv, prepared: Prepared): number {
  return Math.max(1, Math.min(env.fanOutConcurrency, prepared.admission.upstreamRequests));
}
