// One step of a lease: one transaction of the store that flushes its charges, renews it, gives
// back free tokens and takes more. Steps of one lease run one at a time (its `chain`).
import type { LeaseSyncInput, LeaseSyncOutcome } from "../budget-store.js";
import { forget, type Lease, type LeasesState, type LocalHold } from "./state.js";

/** What a step does besides flushing and renewing: see {@link step}. */
export interface StepOptions {
  readonly grow?: LeaseSyncInput["grow"];
  readonly ack?: boolean;
}

/**
 * One step of a lease (runs after the lease's previous step). `grow` asks for more tokens;
 * `ack` acknowledges a drain request. A closing lease gives back all its free tokens, and
 * closes once it holds nothing.
 */
export function step(st: LeasesState, lease: Lease, opts: StepOptions = {}): Promise<void> {
  const plain = opts.grow === undefined && opts.ack !== true;
  // A plain step waiting behind the running one carries every change made until it starts: join it.
  if (plain && lease.again !== undefined) return lease.again;
  const run = (): Promise<void> => runStep(st, lease, opts, plain);
  const result = lease.chain.then(run, run);
  lease.chain = result.catch(() => undefined);
  if (plain) lease.again = result;
  return result;
}

/** The body of a {@link step}, once the lease's previous step ended: resends, then sends the next. */
async function runStep(st: LeasesState, lease: Lease, opts: StepOptions, plain: boolean): Promise<void> {
  if (plain) lease.again = undefined;
  if (lease.closed || lease.lost) return;
  if (lease.unconfirmed !== undefined)
    await send(st, lease, lease.unconfirmed.input, lease.unconfirmed.dirty);
  if (lease.closed || lease.lost) return;
  const dirty = lease.dirty;
  lease.dirty = new Map();
  const input = nextInput(st, lease, opts);
  lease.seq = input.seq;
  lease.pendingCharge = 0;
  lease.pendingChargeIfLost = 0;
  lease.pendingSettled = 0;
  lease.free -= input.release;
  await send(st, lease, input, dirty);
}

/** The store input of the lease's next step (seq + 1), from what it has pending now. */
function nextInput(st: LeasesState, lease: Lease, opts: StepOptions): LeaseSyncInput {
  const { now, s, instanceId, deps } = st;
  const t = now();
  const release = lease.closing || opts.grow !== undefined ? lease.free : 0;
  const close = lease.closing && lease.holds.size === 0 && lease.free - release === 0;
  return {
    leaseId: lease.id,
    keyId: lease.keyId,
    instanceId,
    seq: lease.seq + 1,
    now: t,
    day: deps.dayOf(t),
    expiresAt: t + s.ttlMs,
    charge: lease.pendingCharge,
    chargeIfLost: lease.pendingChargeIfLost,
    settled: lease.pendingSettled,
    release,
    reclaimCharge: lease.floor,
    holds: lease.holds.size,
    acknowledgeDrain: opts.ack === true,
    closing: lease.closing,
    close,
    ...(opts.grow === undefined || lease.closing ? {} : { grow: opts.grow }),
  };
}

/** Sends a step; on an unknown outcome keeps it to send again (same seq) and rethrows. */
async function send(
  st: LeasesState,
  lease: Lease,
  input: LeaseSyncInput,
  dirty: Map<LocalHold, number>,
): Promise<void> {
  const { store, deps } = st;
  lease.unconfirmed = { input, dirty };
  const outcome: LeaseSyncOutcome = await store.syncLease(input);
  lease.unconfirmed = undefined;
  if (outcome.kind === "synced")
    for (const [hold, value] of dirty) hold.confirmed = Math.max(hold.confirmed, value);
  if (outcome.kind === "unknown_key") {
    lease.lost = true;
    return;
  }
  if (outcome.kind === "lost") {
    lease.lost = true;
    lease.free = 0;
    return;
  }
  lease.free += outcome.granted;
  lease.expiresAt = input.expiresAt;
  if (outcome.period !== undefined) {
    lease.periodStart = outcome.period.start;
    lease.periodEnd = outcome.period.end;
    // The store rolled the key over past the lease's period: it ends with its last Hold.
    if (outcome.period.past) {
      lease.closing = true;
      lease.periodOver = true;
    }
  }
  if (outcome.key.revokedAt !== null) lease.revoked = true;
  if (outcome.drain || lease.revoked) lease.closing = true;
  if (input.close) lease.closed = true;
  if (lease.closed || (lease.closing && outcome.tokens === 0)) forget(st, lease);
  if (outcome.drain && input.acknowledgeDrain === false)
    void step(st, lease, { ack: true }).catch(deps.onError);
}
