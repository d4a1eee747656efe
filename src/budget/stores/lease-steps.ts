// The lease steps of a BudgetStore (syncLease), written once for every backend: a lease's first
// step creates it, a retried step answers as before, a step of a lost lease charges what is due
// up to what is free, and the next step charges, releases, grows or closes the lease. A lease's
// tokens are those of the period it was taken in (./periods.ts): after the key rolls over, its
// steps charge and release that period's, grow nothing, and the lease ends with its last Hold.
import type { KeyState, LeasePeriod, LeaseSyncInput, LeaseSyncOutcome } from "../budget-store.js";
import { nextBoundary } from "../period.js";
import type { TxRows } from "./backend.js";
import { type Counters, countersOf, freeIn, rollover } from "./periods.js";
import { type KeyRow, keyState, type LeaseRow, type LeaseUpdate, rewriteLease } from "./rows.js";

/** A step of a lease that is gone: its charge, up to what its period has free; recorded for a retry. */
async function lost(rows: TxRows, key: KeyRow, input: LeaseSyncInput, lease: LeaseRow | undefined) {
  const c = await countersOf(rows, key, lease?.periodStart ?? key.periodStart);
  const charged = Math.min(input.chargeIfLost, Math.max(0, freeIn(c)));
  c.write(c.spent + charged, c.held, c.leased);
  if (charged > 0 || input.settled > 0) rows.addDaily(input.keyId, input.day, charged, input.settled, 0);
  if (lease !== undefined) {
    const step = { seq: input.seq, lastResult: charged, expiresAt: input.now, closedAt: input.now };
    rows.updateLease(lease.id, rewriteLease(lease, step));
  }
  return { kind: "lost", charged } as const;
}

/**
 * {@link BudgetStore.syncLease} inside its transaction: finds the lease (a first step makes a new
 * one), answers a lost lease or a retried step, refuses a step out of order (throws), and applies
 * the next step by {@link applyLeaseStep}.
 */
export async function syncLeaseIn(rows: TxRows, input: LeaseSyncInput): Promise<LeaseSyncOutcome> {
  const [lockedKey, locked] = await Promise.all([rows.lockKey(input.keyId), rows.lockLease(input.leaseId)]);
  if (lockedKey === undefined) return { kind: "unknown_key" };
  const key = rollover(rows, lockedKey, input.now);
  let lease = locked;
  const isNew = lease === undefined;
  if (lease === undefined) {
    // A lease's first step creates its row, unless it is granted nothing.
    if (input.seq !== 1) return lost(rows, key, input, undefined);
    lease = {
      id: input.leaseId,
      keyId: input.keyId,
      state: "open",
      tokens: 0,
      reclaimCharge: 0,
      holds: 0,
      seq: 0,
      lastResult: 0,
      drain: false,
      closing: false,
      expiresAt: input.expiresAt,
      periodStart: key.periodStart,
    };
  }
  if (lease.keyId !== input.keyId) throw new Error(`lease ${input.leaseId} is not a lease of ${input.keyId}`);
  if (lease.state === "reclaimed") {
    if (lease.seq === input.seq) return { kind: "lost", charged: lease.lastResult };
    return lost(rows, key, input, lease);
  }
  if (lease.seq === input.seq) {
    // A retry of the step last applied (its answer was lost): answer as then.
    return {
      kind: "synced",
      granted: lease.lastResult,
      tokens: lease.tokens,
      drain: lease.drain,
      key: keyState(key),
      ...periodOfLease(key, lease),
    };
  }
  if (lease.state === "closed" || lease.seq !== input.seq - 1) {
    throw new Error(
      `lease ${input.leaseId}: step ${input.seq} out of order (${lease.state}, last step ${lease.seq})`,
    );
  }
  return applyLeaseStep(rows, key, lease, isNew, input, await countersOf(rows, key, lease.periodStart));
}

/** The period of a step's answer: the lease's, its end, whether the key is past it; none without a period. */
function periodOfLease(key: KeyRow, lease: LeaseRow): { period?: LeasePeriod } {
  if (key.period === "none" && lease.periodStart === key.periodStart) return {};
  const start = lease.periodStart;
  return { period: { start, end: nextBoundary(key.period, start), past: start !== key.periodStart } };
}

/**
 * Applies the lease step that follows `lease`'s last (the key and lease rows locked, `c` the
 * counters of the lease's period): charges and releases tokens, grows the lease by what
 * `input.grow` asks (up to what is free; only in the key's current period) or closes it, and
 * writes the lease row (inserted when `isNew` and it holds tokens), the period's numbers and the
 * day's usage. Throws when charge + release exceed the lease's tokens.
 */
function applyLeaseStep(
  rows: TxRows,
  key: KeyRow,
  lease: LeaseRow,
  isNew: boolean,
  input: LeaseSyncInput,
  c: Counters,
): LeaseSyncOutcome {
  const { charge, release } = input;
  if (charge + release > lease.tokens) {
    throw new Error(
      `lease ${input.leaseId}: charge ${charge} + release ${release} > its ${lease.tokens} tokens`,
    );
  }
  let tokens = lease.tokens - charge - release;
  const spent = c.spent + charge;
  let leased = c.leased - charge - release;
  let granted = 0;
  if (input.grow !== undefined && key.revokedAt === null && !input.close && c.current) {
    const free = c.budget - spent - c.held - leased;
    const state: KeyState = { ...keyState(key), spentTokens: spent, leasedTokens: leased };
    granted = Math.max(0, Math.min(Math.floor(input.grow(free, state)), free));
    tokens += granted;
    leased += granted;
  }
  if (input.close) {
    leased -= tokens;
    tokens = 0;
  }
  const drain = input.acknowledgeDrain ? false : lease.drain;
  const update: LeaseUpdate = {
    state: input.close ? "closed" : "open",
    tokens,
    reclaimCharge: input.close ? 0 : Math.min(input.reclaimCharge, tokens),
    holds: input.close ? 0 : input.holds,
    seq: input.seq,
    lastResult: granted,
    drain,
    closing: input.closing,
    expiresAt: input.expiresAt,
    closedAt: input.close ? input.now : null,
  };
  if (!isNew) rows.updateLease(input.leaseId, update);
  else if (tokens > 0) {
    const row = { id: input.leaseId, keyId: input.keyId, instanceId: input.instanceId, createdAt: input.now };
    rows.insertLease({ ...row, periodStart: lease.periodStart }, update);
  }
  c.write(spent, c.held, leased);
  if (charge > 0 || input.settled > 0) rows.addDaily(input.keyId, input.day, charge, input.settled, 0);
  return {
    kind: "synced",
    granted,
    tokens,
    drain,
    key: c.current ? { ...keyState(key), spentTokens: spent, leasedTokens: leased } : keyState(key),
    ...periodOfLease(key, lease),
  };
}
