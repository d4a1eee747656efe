// Leases: a gateway replica takes a slice of a key's Budget in one statement and places Holds
// against it in memory; charges go back to the store in batches. src/budget/README.md, "Leases",
// gives the design and what a crash can cost.
import { generateHoldId, generateKeyId } from "./api-key.js";
import type { BudgetStore, KeyState, LeaseSyncInput, LeaseSyncOutcome } from "./budget-store.js";
import { demandTokens, type HoldDemand } from "./plan-hold.js";
import type { LedgerSettleResult, StoreWrites } from "./store-writes.js";

/** How a replica leases. Amounts are tokens; times are milliseconds. */
export interface LeaseOptions {
  /** Fraction of a key's free tokens one lease takes. @default 0.125 */
  readonly share?: number;
  /** Most tokens one lease takes. @default 10_000_000 */
  readonly maxTokens?: number;
  /**
   * A lease is taken only when it holds at least this many times the request that asks for it;
   * below that (the end of a Budget) every Hold is one transaction. @default 4
   */
  readonly minHolds?: number;
  /** A lease not renewed for this long is reclaimed by the other replicas. @default 30_000 */
  readonly ttlMs?: number;
  /** Charges settled from a lease reach the store (and the lease is renewed) this often. @default 1000 */
  readonly syncIntervalMs?: number;
  /** How often a replica looks for requests to give back its leases' free tokens. @default 100 */
  readonly drainPollMs?: number;
  /** Longest a request waits for other replicas to give back free tokens before its 429. @default 2000 */
  readonly drainWaitMs?: number;
  /** After a replica asked the others to drain, no new lease on that key for this long. @default 30_000 */
  readonly blockMs?: number;
  /** A lease that placed no Hold for this long gives its free tokens back and ends when empty. @default 5000 */
  readonly idleMs?: number;
}

/** {@link LeaseOptions} with every default filled in. */
export type LeaseSettings = Required<LeaseOptions>;

/** The defaults of {@link LeaseOptions}. */
export const DEFAULT_LEASE_SETTINGS: LeaseSettings = {
  share: 0.125,
  maxTokens: 10_000_000,
  minHolds: 4,
  ttlMs: 30_000,
  syncIntervalMs: 1000,
  drainPollMs: 100,
  drainWaitMs: 2000,
  blockMs: 30_000,
  idleMs: 5000,
};

/**
 * Tokens a new lease takes: `share` of the key's free tokens, at most `maxTokens`, and nothing
 * when that is less than `minHolds` requests of `need` tokens, when the key is revoked, or while
 * new leases on it are blocked (another replica asked for a drain). Pure.
 */
export function leaseGrant(free: number, key: KeyState, need: number, now: number, s: LeaseSettings): number {
  if (key.revokedAt !== null || now < key.leaseBlockUntil) return 0;
  const tokens = Math.min(s.maxTokens, Math.floor(free * s.share));
  return tokens >= need * s.minHolds ? tokens : 0;
}

/** A Hold placed in memory against a lease. */
interface LocalHold {
  readonly id: string;
  readonly lease: Lease;
  readonly tokens: number;
  /** Tokens used as recorded by the last renew (what a reclaim charges for it). */
  recorded: number;
  /** `recorded` as of the last step the store applied (what a reclaim of the lease would charge). */
  confirmed: number;
  expiresAt: number;
  /**
   * The Hold in the store that took it over after its lease was lost ({@link Leases.move}): it
   * holds what this Hold may use beyond `confirmed` (the reclaim charged `confirmed`).
   */
  moved: string | undefined;
}

/** A lease as this replica keeps it: tokens = free + held + pendingCharge (+ a step in flight). */
interface Lease {
  readonly id: string;
  readonly keyId: string;
  /** Last step sent. */
  seq: number;
  free: number;
  held: number;
  /** Σ recorded over the live Holds. */
  floor: number;
  pendingCharge: number;
  /** Σ over the Holds in pendingCharge of charge − confirmed (due if the lease turns out lost). */
  pendingChargeIfLost: number;
  pendingSettled: number;
  readonly holds: Set<LocalHold>;
  /** Holds renewed since the last step was sent, with the value that step records. */
  dirty: Map<LocalHold, number>;
  /** Takes no new Holds; gives its free tokens back at each step, ends once empty (drained, idle, low, revoked). */
  closing: boolean;
  /** The key is revoked (refuse at once). */
  revoked: boolean;
  /** Reclaimed by another replica: every Hold on it ends with a late charge. */
  lost: boolean;
  closed: boolean;
  /** The store's expiry as last confirmed. */
  expiresAt: number;
  lastPlacedAt: number;
  /** A step sent whose outcome is unknown: it is sent again (same seq) before anything else. */
  unconfirmed: { input: LeaseSyncInput; dirty: Map<LocalHold, number> } | undefined;
  /** The running or last step (steps of one lease run one at a time). */
  chain: Promise<unknown>;
  /** A plain step queued behind the running one, not started yet (later plain steps join it). */
  again: Promise<void> | undefined;
}

/** What a closed local Hold left, for a repeated or late settle. */
interface Tombstone {
  readonly keyId: string;
  readonly state: "settled" | "reclaimed";
  /** Tokens already charged for it (a reclaim's recorded use). */
  readonly charged: number;
  readonly tokens: number;
}

const TOMBSTONES = 100_000;

/** Dependencies of {@link createLeases}. */
export interface LeaseDeps {
  readonly store: BudgetStore;
  readonly instanceId: string;
  readonly settings: LeaseSettings;
  readonly now: () => number;
  readonly dayOf: (now: number) => string;
  readonly holdTtlMs: number;
  readonly onError: (err: unknown) => void;
  /**
   * The ledger's writes that end a Hold (a moved Hold's settle, a late charge): kept and written
   * again, once per Hold id, when the store fails them (src/budget/store-writes.ts).
   */
  readonly writes: Pick<StoreWrites, "settle" | "chargeLate">;
}

/** A Hold placed from a lease, or the reason none was. */
export type LeasePlacement =
  | { readonly kind: "held"; readonly holdId: string; readonly tokens: number }
  | { readonly kind: "revoked" }
  | { readonly kind: "none" };

/** What {@link Leases.confirm} found: the Hold's lease renewed, or lost (reclaimed by another replica). */
export type LeaseStanding =
  | { readonly kind: "current" }
  | {
      readonly kind: "lost";
      readonly keyId: string;
      /** What the Hold may still use beyond what the reclaim charged for it. */
      readonly uncoveredTokens: number;
    };

/** The lease side of a ledger: see {@link createLeases}. */
export interface Leases {
  /** Places a Hold from the key's lease (taking or topping one up when the Budget has room), or says none fits. */
  place(keyId: string, demand: HoldDemand): Promise<LeasePlacement>;
  /** True when holdId is (or was) a Hold of this replica's leases. */
  owns(holdId: string): boolean;
  renew(holdId: string, usedTokens: number, ttlMs: number): Promise<boolean>;
  /** `pending` when its write to the store (a moved Hold, a late charge) waits for the store. */
  settle(holdId: string, usedTokens: number): Promise<LedgerSettleResult>;
  /**
   * Whether a Hold may go on delivering without a look at the store: true for a Hold no longer
   * live here or moved into the store, and for one whose lease the store confirmed with more than a
   * quarter of its TTL to go. False once this replica went that long without a step (a stall, the
   * store unreachable): past the lease's expiry another replica may reclaim it and grant its tokens
   * again. Synchronous: asked before every chunk a stream delivers.
   */
  current(holdId: string): boolean;
  /**
   * Steps the Hold's lease (renewing it): `current`, or `lost` when another replica reclaimed it
   * meanwhile. Throws what the store throws (it cannot be reached: nothing is known).
   */
  confirm(holdId: string): Promise<LeaseStanding>;
  /** The Hold of a lost lease is taken over by `storeHoldId`, placed in the store for its uncovered tokens. */
  move(holdId: string, storeHoldId: string): boolean;
  /** Releases local Holds past their expiry (charging what their last renew recorded); returns how many. */
  reclaimLocal(): number;
  /** Gives back the free tokens of every lease on the key (a revoke on this replica). */
  drainKey(keyId: string): Promise<void>;
  /** Steps every lease now: charges flushed, renewed, drained, idle ones closed. */
  syncAll(): Promise<void>;
  /** Stops the timers, flushes every lease, returns its free tokens and closes the empty ones. */
  close(): Promise<void>;
  /** Live leases and local Holds, for tests and metrics. */
  stats(): { leases: number; holds: number; freeTokens: number };
}

/**
 * Leases of one ledger (one replica). Holds against a lease cost no store round trip; a step per
 * lease (one transaction) flushes charges, renews the lease, gives back free tokens and takes more.
 * Starts two unref'd timers: steps every `syncIntervalMs`, drain requests every `drainPollMs`.
 */
export function createLeases(deps: LeaseDeps): Leases {
  const { store, instanceId, now } = deps;
  // A lease is renewed at the step after half its life is gone: steps come at least 8 times a
  // life, so that a lease renewed on schedule keeps more than a quarter of it (what `current`
  // asks) at every moment.
  const s: LeaseSettings = {
    ...deps.settings,
    syncIntervalMs: Math.max(1, Math.min(deps.settings.syncIntervalMs, Math.floor(deps.settings.ttlMs / 8))),
  };
  /** Per key: the lease taking Holds, and older ones still holding some. */
  const byKey = new Map<
    string,
    { current: Lease | undefined; retired: Set<Lease>; lock: Promise<unknown>; noLeaseUntil: number }
  >();
  const holds = new Map<string, LocalHold>();
  const tombstones = new Map<string, Tombstone>();
  let closing = false;

  const entryOf = (keyId: string) => {
    let e = byKey.get(keyId);
    if (e === undefined) {
      e = { current: undefined, retired: new Set(), lock: Promise.resolve(), noLeaseUntil: 0 };
      byKey.set(keyId, e);
    }
    return e;
  };
  const leases = function* () {
    for (const e of byKey.values()) {
      if (e.current) yield e.current;
      yield* e.retired;
    }
  };

  /** Serializes the slow path of one key within this replica. */
  function withKeyLock<T>(keyId: string, fn: () => Promise<T>): Promise<T> {
    const e = entryOf(keyId);
    const result = e.lock.then(fn, fn);
    e.lock = result.catch(() => undefined);
    return result;
  }

  const usable = (l: Lease | undefined): l is Lease =>
    l !== undefined && !l.closing && !l.lost && !l.closed && !l.revoked && now() < l.expiresAt - s.ttlMs / 4;

  function newLease(keyId: string): Lease {
    return {
      id: `lease_${generateKeyId().slice(4)}${generateKeyId().slice(4)}`,
      keyId,
      seq: 0,
      free: 0,
      held: 0,
      floor: 0,
      pendingCharge: 0,
      pendingChargeIfLost: 0,
      pendingSettled: 0,
      holds: new Set(),
      dirty: new Map(),
      closing: false,
      revoked: false,
      lost: false,
      closed: false,
      expiresAt: 0,
      lastPlacedAt: now(),
      unconfirmed: undefined,
      chain: Promise.resolve(),
      again: undefined,
    };
  }

  function placeOn(lease: Lease, need: number): LeasePlacement {
    const hold: LocalHold = {
      id: generateHoldId(),
      lease,
      tokens: need,
      recorded: 0,
      confirmed: 0,
      expiresAt: now() + deps.holdTtlMs,
      moved: undefined,
    };
    lease.free -= need;
    lease.held += need;
    lease.holds.add(hold);
    lease.lastPlacedAt = now();
    holds.set(hold.id, hold);
    return { kind: "held", holdId: hold.id, tokens: need };
  }

  /** Moves a live Hold out of its lease: `charge` to be flushed, the rest free again. */
  function closeLocal(hold: LocalHold, charge: number, state: Tombstone["state"]): void {
    const { lease } = hold;
    holds.delete(hold.id);
    lease.holds.delete(hold);
    lease.dirty.delete(hold);
    lease.held -= hold.tokens;
    lease.floor -= hold.recorded;
    lease.pendingCharge += charge;
    lease.pendingChargeIfLost += Math.max(0, charge - hold.confirmed);
    if (state === "settled") lease.pendingSettled += 1;
    lease.free += hold.tokens - charge;
    tombstones.set(hold.id, { keyId: lease.keyId, state, charged: charge, tokens: hold.tokens });
    if (tombstones.size > TOMBSTONES) {
      const oldest = tombstones.keys().next().value;
      if (oldest !== undefined) tombstones.delete(oldest);
    }
  }

  /**
   * One step of a lease (runs after the lease's previous step). `grow` asks for more tokens;
   * `ack` acknowledges a drain request. A closing lease gives back all its free tokens, and
   * closes once it holds nothing.
   */
  function step(lease: Lease, opts: { grow?: LeaseSyncInput["grow"]; ack?: boolean } = {}): Promise<void> {
    const plain = opts.grow === undefined && opts.ack !== true;
    // A plain step waiting behind the running one carries every change made until it starts: join it.
    if (plain && lease.again !== undefined) return lease.again;
    const run = async (): Promise<void> => {
      if (plain) lease.again = undefined;
      if (lease.closed || lease.lost) return;
      if (lease.unconfirmed !== undefined)
        await send(lease, lease.unconfirmed.input, lease.unconfirmed.dirty);
      if (lease.closed || lease.lost) return;
      const t = now();
      const release = lease.closing || opts.grow !== undefined ? lease.free : 0;
      const close = lease.closing && lease.holds.size === 0 && lease.free - release === 0;
      const dirty = lease.dirty;
      lease.dirty = new Map();
      const input: LeaseSyncInput = {
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
      lease.seq = input.seq;
      lease.pendingCharge = 0;
      lease.pendingChargeIfLost = 0;
      lease.pendingSettled = 0;
      lease.free -= release;
      await send(lease, input, dirty);
    };
    const result = lease.chain.then(run, run);
    lease.chain = result.catch(() => undefined);
    if (plain) lease.again = result;
    return result;
  }

  /** Sends a step; on an unknown outcome keeps it to send again (same seq) and rethrows. */
  async function send(lease: Lease, input: LeaseSyncInput, dirty: Map<LocalHold, number>): Promise<void> {
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
    if (outcome.key.revokedAt !== null) lease.revoked = true;
    if (outcome.drain || lease.revoked) lease.closing = true;
    if (input.close) lease.closed = true;
    if (lease.closed || (lease.closing && outcome.tokens === 0)) forget(lease);
    if (outcome.drain && input.acknowledgeDrain === false)
      void step(lease, { ack: true }).catch(deps.onError);
  }

  function forget(lease: Lease): void {
    const e = byKey.get(lease.keyId);
    if (e === undefined) return;
    if (e.current === lease) e.current = undefined;
    e.retired.delete(lease);
  }

  function retire(lease: Lease): void {
    lease.closing = true;
    const e = entryOf(lease.keyId);
    if (e.current === lease) e.current = undefined;
    e.retired.add(lease);
  }

  async function place(keyId: string, demand: HoldDemand): Promise<LeasePlacement> {
    const need = demandTokens(demand);
    const fast = byKey.get(keyId)?.current;
    if (fast?.revoked) return { kind: "revoked" };
    if (usable(fast) && fast.free >= need) return placeOn(fast, need);
    if (closing) return { kind: "none" };
    return withKeyLock(keyId, async () => {
      const e = entryOf(keyId);
      let lease = e.current;
      if (lease?.revoked) return { kind: "revoked" };
      if (usable(lease) && lease.free >= need) return placeOn(lease, need);
      if (lease !== undefined && !usable(lease)) {
        retire(lease);
        lease = undefined;
      }
      // The last try granted nothing (the end of the Budget): Holds are one transaction each for a while.
      if (lease === undefined && now() < e.noLeaseUntil) return { kind: "none" };
      const grow = (free: number, key: KeyState) => leaseGrant(free, key, need, now(), s);
      if (lease === undefined) {
        lease = newLease(keyId);
        e.current = lease;
      }
      try {
        // Give back what the lease has free and take a new slice, in one step.
        await step(lease, { grow });
      } catch (err) {
        if (lease.seq === 1 && lease.unconfirmed !== undefined) lease.closing = true;
        throw err;
      }
      if (lease.revoked) return { kind: "revoked" };
      if (!lease.lost && !lease.closing && lease.free >= need) return placeOn(lease, need);
      // Not granted (the end of the Budget, or leases blocked): Holds are one transaction each.
      e.noLeaseUntil = now() + s.syncIntervalMs;
      if (!lease.closed && !lease.lost) {
        if (lease.holds.size === 0 && lease.seq === 1 && lease.free === 0) forget(lease);
        else retire(lease);
      }
      return { kind: "none" };
    });
  }

  async function renew(holdId: string, usedTokens: number, ttlMs: number): Promise<boolean> {
    const hold = holds.get(holdId);
    if (hold === undefined) return false;
    hold.expiresAt = now() + ttlMs;
    if (hold.moved !== undefined) {
      const used = Math.max(0, Math.min(usedTokens, hold.tokens) - hold.confirmed);
      return store.renewHold(hold.moved, hold.expiresAt, used);
    }
    const recorded = Math.min(Math.max(hold.recorded, usedTokens), hold.tokens);
    if (recorded > hold.recorded) {
      hold.lease.floor += recorded - hold.recorded;
      hold.recorded = recorded;
      hold.lease.dirty.set(hold, recorded);
      // The renewal is durable once a step carrying it is applied.
      await step(hold.lease);
    }
    return holds.has(holdId) && !hold.lease.lost;
  }

  /** A late charge of a Hold of this replica, by its id (once), kept while the store cannot write it. */
  async function chargeLate(holdId: string, keyId: string, tokens: number): Promise<LedgerSettleResult> {
    const charged = await deps.writes.chargeLate({ holdId, keyId, tokens, instanceId });
    return charged === "pending"
      ? { outcome: "pending", chargedTokens: 0, releasedTokens: 0 }
      : { outcome: "settled_after_reclaim", chargedTokens: charged, releasedTokens: 0 };
  }

  async function settle(holdId: string, usedTokens: number): Promise<LedgerSettleResult> {
    const hold = holds.get(holdId);
    if (hold !== undefined) {
      const charge = Math.min(usedTokens, hold.tokens);
      if (hold.moved !== undefined) {
        // The store's Hold settles what the reclaim of the lease did not charge.
        holds.delete(holdId);
        hold.lease.holds.delete(hold);
        tombstones.set(holdId, {
          keyId: hold.lease.keyId,
          state: "settled",
          charged: 0,
          tokens: hold.tokens,
        });
        const result = await deps.writes.settle(hold.moved, Math.max(0, charge - hold.confirmed));
        return result ?? { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
      }
      if (!hold.lease.lost) {
        const { lease } = hold;
        closeLocal(hold, charge, "settled");
        // A closing lease gives what the Hold released back to the Budget before settle resolves.
        if (lease.closing && (hold.tokens > charge || lease.holds.size === 0)) {
          await step(lease).catch(deps.onError); // settled here either way; a failed step is sent again
        }
        return { outcome: "settled", chargedTokens: charge, releasedTokens: hold.tokens - charge };
      }
      // The lease was reclaimed by another replica: charged what the store had recorded for it.
      holds.delete(holdId);
      hold.lease.holds.delete(hold);
      tombstones.set(holdId, { keyId: hold.lease.keyId, state: "settled", charged: 0, tokens: hold.tokens });
      return chargeLate(holdId, hold.lease.keyId, Math.max(0, charge - hold.confirmed));
    }
    const dead = tombstones.get(holdId);
    if (dead === undefined || dead.state === "settled") {
      return { outcome: "already_settled", chargedTokens: 0, releasedTokens: 0 };
    }
    // Reclaimed here as stale, then settled: the rest of its charge, up to what the Budget has free.
    tombstones.set(holdId, { ...dead, state: "settled" });
    const extra = Math.max(0, Math.min(usedTokens, dead.tokens) - dead.charged);
    if (extra === 0) return { outcome: "settled_after_reclaim", chargedTokens: 0, releasedTokens: 0 };
    return chargeLate(holdId, dead.keyId, extra);
  }

  function current(holdId: string): boolean {
    const hold = holds.get(holdId);
    if (hold === undefined || hold.moved !== undefined) return true;
    const { lease } = hold;
    return !lease.lost && now() < lease.expiresAt - s.ttlMs / 4;
  }

  async function confirm(holdId: string): Promise<LeaseStanding> {
    const hold = holds.get(holdId);
    if (hold === undefined || hold.moved !== undefined) return { kind: "current" };
    const { lease } = hold;
    for (let tries = 0; !lease.lost; tries++) {
      await withinMargin(lease, step(lease));
      if (lease.lost) break;
      // A lease closed meanwhile ended with its last Hold: this one is gone, nothing more to confirm.
      if (!holds.has(holdId) || lease.closed) return { kind: "current" };
      // An answer read after the lease's margin (a stall while the step was in flight) vouches for nothing.
      if (now() < lease.expiresAt - s.ttlMs / 4) return { kind: "current" };
      if (tries >= 2) throw new Error(`lease ${lease.id}: its steps' answers come too late to vouch for it`);
    }
    return {
      kind: "lost",
      keyId: lease.keyId,
      uncoveredTokens: Math.max(0, hold.tokens - hold.confirmed),
    };
  }

  /**
   * `work` (a step of `lease`), or a rejection once what is left of the lease's life (at least an
   * eighth of its TTL) passed with it pending: a store that does not answer (a partition drops the
   * packets, the connection stays open) fails the request closed rather than holding it. The step
   * itself goes on (the lease's chain).
   */
  function withinMargin(lease: Lease, work: Promise<void>): Promise<void> {
    const waitMs = Math.max(lease.expiresAt - now(), s.ttlMs / 8);
    return answeredWithin(
      work,
      waitMs,
      () => `Budget store: lease ${lease.id} was not renewed within ${Math.round(waitMs)} ms`,
    );
  }

  function move(holdId: string, storeHoldId: string): boolean {
    const hold = holds.get(holdId);
    if (hold === undefined) return false;
    hold.moved = storeHoldId;
    return true;
  }

  function reclaimLocal(): number {
    const t = now();
    let n = 0;
    for (const hold of [...holds.values()]) {
      // A moved Hold is the store's: its row is reclaimed there, and its settle goes there.
      if (hold.expiresAt > t || hold.moved !== undefined) continue;
      closeLocal(hold, hold.recorded, "reclaimed");
      n++;
    }
    return n;
  }

  async function syncAll(): Promise<void> {
    const t = now();
    const work: Promise<void>[] = [];
    for (const lease of [...leases()]) {
      if (lease.closed || lease.lost) {
        forget(lease);
        continue;
      }
      if (!lease.closing && t - lease.lastPlacedAt >= s.idleMs) retire(lease);
      const due =
        lease.unconfirmed !== undefined ||
        lease.pendingCharge > 0 ||
        lease.dirty.size > 0 ||
        (lease.closing && (lease.free > 0 || lease.holds.size === 0)) ||
        lease.expiresAt - t < s.ttlMs / 2;
      if (due) work.push(step(lease));
    }
    const results = await Promise.allSettled(work);
    for (const r of results) if (r.status === "rejected") deps.onError(r.reason);
  }

  async function pollDrains(): Promise<void> {
    let any = false;
    for (const _ of leases()) {
      any = true;
      break;
    }
    if (!any) return;
    const ids = new Set(await store.drainRequests(instanceId));
    if (ids.size === 0) return;
    const work: Promise<void>[] = [];
    for (const lease of [...leases()]) {
      if (!ids.has(lease.id)) continue;
      retire(lease);
      work.push(step(lease, { ack: true }));
    }
    const results = await Promise.allSettled(work);
    for (const r of results) if (r.status === "rejected") deps.onError(r.reason);
  }

  let syncing = false;
  const syncTimer = setInterval(() => {
    if (syncing) return;
    syncing = true;
    void syncAll().finally(() => {
      syncing = false;
    });
  }, s.syncIntervalMs);
  syncTimer.unref();
  let polling = false;
  const drainTimer = setInterval(() => {
    if (polling) return;
    polling = true;
    void pollDrains()
      .catch(deps.onError)
      .finally(() => {
        polling = false;
      });
  }, s.drainPollMs);
  drainTimer.unref();

  return {
    place,
    owns: (holdId) => holds.has(holdId) || tombstones.has(holdId),
    renew,
    settle,
    current,
    confirm,
    move,
    reclaimLocal,
    async drainKey(keyId) {
      const e = byKey.get(keyId);
      if (e === undefined) return;
      const all = [...(e.current ? [e.current] : []), ...e.retired];
      for (const lease of all) {
        lease.revoked = true;
        retire(lease);
      }
      await Promise.all(all.map((l) => step(l)));
    },
    syncAll,
    async close() {
      closing = true;
      clearInterval(syncTimer);
      clearInterval(drainTimer);
      for (const lease of [...leases()]) retire(lease);
      const results = await Promise.allSettled([...leases()].map((l) => step(l)));
      for (const r of results) if (r.status === "rejected") deps.onError(r.reason);
    },
    stats() {
      let n = 0;
      let free = 0;
      for (const l of leases()) {
        n++;
        free += l.free;
      }
      return { leases: n, holds: holds.size, freeTokens: free };
    },
  };
}

/**
 * `work`'s outcome, or a rejection with `Error(message())` once `waitMs` ms passed with it still
 * pending (the work itself goes on). Used where a store's answer is only worth something while a
 * Hold or lease still stands: a store that never answers fails the request closed, not hung.
 */
export function answeredWithin<T>(work: Promise<T>, waitMs: number, message: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message())), waitMs);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}
