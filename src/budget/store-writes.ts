// Whether the ledger's store can write, and the settles it could not write yet (issue 33): a settle
// that fails is kept, in order, and written again until the store takes it; its Hold stays open in
// the store meanwhile, so its tokens stay reserved. src/budget/README.md, "When the store fails".
import type { BudgetStore, LateChargeInput, SettleResult } from "./budget-store.js";

/** A settle the store could not write yet: kept by the ledger and written again until it is. */
export interface PendingSettleResult {
  readonly outcome: "pending";
  readonly chargedTokens: 0;
  readonly releasedTokens: 0;
}

/** What the ledger's settle answers: the store's outcome, or `pending` (written later). */
export type LedgerSettleResult = SettleResult | PendingSettleResult;

/**
 * Most settles kept waiting for the store. Past it the ledger places no new Hold in the store (503
 * `upstream_unavailable`), so the queue holds at most this many plus the Holds of the requests in
 * flight then: about 100 bytes each.
 */
export const MAX_PENDING_SETTLES = 10_000;

/** First and longest pause between two tries of a failed write (a pending settle or a probe), ms. */
export const WRITE_RETRY_MIN_MS = 50;
export const WRITE_RETRY_MAX_MS = 1000;

/** A late charge's answer: the tokens charged, or `pending` (written later, once). */
export type LedgerLateCharge = number | "pending";

/**
 * A write that ends a Hold, kept until the store takes it: a settle of a Hold in the store, or the
 * late charge of a lease-backed Hold (its lease lost, or it was reclaimed as stale). Each is
 * written by the Hold's id, so a repeat does nothing.
 */
type PendingWrite =
  | { readonly kind: "settle"; readonly holdId: string; readonly usedTokens: number }
  | { readonly kind: "late"; readonly holdId: string; readonly input: Omit<LateChargeInput, "now" | "day"> };

const tokensOf = (p: PendingWrite): number => (p.kind === "settle" ? p.usedTokens : p.input.tokens);

/** What {@link watchStoreWrites} reports when the ledger turns (not) writable. */
export interface WritableChange {
  readonly writable: boolean;
  /** Settles waiting for the store, and their tokens (charges not written yet). */
  readonly pendingSettles: number;
  readonly pendingTokens: number;
  /** The write that failed (when turning not writable). */
  readonly error?: unknown;
}

/** See {@link watchStoreWrites}. */
export interface StoreWrites {
  /** The store, each of its writes watched: one that fails makes the ledger not writable. */
  readonly store: BudgetStore;
  /** False from a failed write until a write succeeds again and every pending settle is written. */
  readonly writable: boolean;
  /** Settles waiting for the store. */
  readonly pendingSettles: number;
  /** True while {@link MAX_PENDING_SETTLES} or more settles wait: place no new Hold in the store. */
  readonly full: boolean;
  /**
   * Settles a Hold of the store: the store's answer (undefined for an unknown Hold id), or
   * `pending` when the store fails to write it — or other settles still wait, so that they are
   * written in the order asked. A pending settle is written again (settleHold: by the Hold's id, a
   * no-op once settled, so never charged twice) until the store takes it.
   */
  settle(holdId: string, usedTokens: number): Promise<LedgerSettleResult | undefined>;
  /**
   * {@link BudgetStore.chargeLate}, kept and written again like a settle (in the same queue, by the
   * Hold's id: once) when the store fails to write it or other writes wait: `pending` then.
   */
  chargeLate(input: Omit<LateChargeInput, "now" | "day">): Promise<LedgerLateCharge>;
  /** One last try of the pending settles (in order, up to the first that fails); reports what is left. */
  close(): Promise<void>;
}

/** Options of {@link watchStoreWrites}. */
export interface StoreWritesOptions {
  readonly now: () => number;
  readonly dayOf: (now: number) => string;
  /** Told of settles that cannot be written (an unknown Hold, settles left at close). */
  readonly onError: (err: unknown) => void;
  /** Told when the ledger turns not writable, and writable again. */
  readonly onWritableChange?: (change: WritableChange) => void;
  /** @default {@link MAX_PENDING_SETTLES} */
  readonly maxPendingSettles?: number;
}

const WRITES = [
  "insertKey",
  "addBudget",
  "revokeKey",
  "createKeyAudited",
  "changeKey",
  "createAdminKey",
  "revokeAdminKey",
  "placeHold",
  "renewHold",
  "settleHold",
  "chargeLate",
  "syncLease",
  "reclaimExpired",
  "reclaimOpen",
  "purgeClosed",
  "probeWrite",
] as const satisfies ReadonlyArray<keyof BudgetStore>;

/** The state of {@link watchStoreWrites}: the pending writes, in order, and the retry timer. */
interface Watch {
  readonly inner: BudgetStore;
  readonly options: StoreWritesOptions;
  readonly maxPending: number;
  readonly queue: PendingWrite[];
  /** The Hold ids in `queue` (each is kept once). */
  readonly queued: Set<string>;
  /** The watched store (set once built): the retry timer probes through it, so its outcome counts. */
  store: BudgetStore;
  /** A write failed and none succeeded since. */
  failing: boolean;
  /** What onWritableChange last said. */
  reported: boolean;
  lastError: unknown;
  retries: number;
  timer: NodeJS.Timeout | undefined;
  draining: Promise<void> | undefined;
  closed: boolean;
}

const pendingTokens = (w: Watch): number => w.queue.reduce((sum, p) => sum + tokensOf(p), 0);
const isWritable = (w: Watch): boolean => !w.failing && w.queue.length === 0;

/** Tells onWritableChange when writable changed since it was last told. */
function report(w: Watch): void {
  const now = isWritable(w);
  if (now === w.reported) return;
  w.reported = now;
  w.options.onWritableChange?.({
    writable: now,
    pendingSettles: w.queue.length,
    pendingTokens: pendingTokens(w),
    ...(now ? {} : { error: w.lastError }),
  });
}

/** Arms the retry timer (50 ms, doubling up to 1 s) while not writable: a drain, or else a probe. */
function schedule(w: Watch): void {
  if (w.closed || w.timer !== undefined || isWritable(w)) return;
  const delay = Math.min(WRITE_RETRY_MAX_MS, WRITE_RETRY_MIN_MS * 2 ** Math.min(w.retries, 10));
  w.retries++;
  w.timer = setTimeout(() => {
    w.timer = undefined;
    if (w.queue.length > 0) void drain(w);
    else void w.store.probeWrite().catch(() => undefined); // its outcome is noted by the wrapper
  }, delay);
  w.timer.unref();
}

/** A write succeeded: writable again once the pending writes are written (started now). */
function wrote(w: Watch): void {
  w.failing = false;
  w.retries = 0;
  if (w.queue.length > 0) void drain(w);
  else report(w);
}

/** A write failed: not writable, tried again later. */
function failed(w: Watch, err: unknown): void {
  w.failing = true;
  w.lastError = err;
  report(w);
  schedule(w);
}

/** `inner` with each of its {@link WRITES} watched: a failure makes the ledger not writable. */
function watchedStore(w: Watch): BudgetStore {
  const { inner } = w;
  const store: BudgetStore = { ...inner };
  for (const name of WRITES) {
    const write = (inner[name] as (...args: unknown[]) => Promise<unknown>).bind(inner);
    (store as unknown as Record<string, unknown>)[name] = async (...args: unknown[]) => {
      let result: unknown;
      try {
        result = await write(...args);
      } catch (err) {
        failed(w, err);
        throw err;
      }
      wrote(w);
      return result;
    };
  }
  return store;
}

/** One pending write, to the store itself (not the watched wrapper). */
async function writeOne(w: Watch, p: PendingWrite): Promise<SettleResult | number | undefined> {
  const t = w.options.now();
  const day = w.options.dayOf(t);
  return p.kind === "settle"
    ? w.inner.settleHold(p.holdId, p.usedTokens, t, day)
    : w.inner.chargeLate({ ...p.input, now: t, day });
}

/** Writes the pending writes in order, up to the first that fails (then tried again later). */
function drain(w: Watch): Promise<void> {
  w.draining ??= drainQueue(w);
  return w.draining;
}

/** The one drain under way (see {@link drain}). */
async function drainQueue(w: Watch): Promise<void> {
  try {
    while (w.queue.length > 0) {
      const p = w.queue[0] as PendingWrite;
      let result: SettleResult | number | undefined;
      try {
        result = await writeOne(w, p);
      } catch (err) {
        w.failing = true;
        w.lastError = err;
        schedule(w);
        return;
      }
      w.queue.shift();
      w.queued.delete(p.holdId);
      if (result === undefined) {
        w.options.onError(
          new Error(
            `Budget ledger: the settle of Hold ${p.holdId} (${tokensOf(p)} tokens used) found no such Hold: ` +
              "it was closed and purged while the settle waited; nothing was charged",
          ),
        );
      }
    }
    w.failing = false;
    w.retries = 0;
  } finally {
    w.draining = undefined;
    report(w);
  }
}

/**
 * Writes `p` now when nothing waits; else, or when the store fails it, keeps it at the end of the
 * queue (once per Hold id) and answers undefined: written later, in order.
 */
async function writeOrKeep<T extends SettleResult | number | undefined>(
  w: Watch,
  p: PendingWrite,
): Promise<{ written: T } | undefined> {
  let error: unknown;
  if (w.queue.length === 0) {
    try {
      const written = (await writeOne(w, p)) as T;
      wrote(w);
      return { written };
    } catch (err) {
      // Kept below and written again; the Hold stays open (reserved) in the store meanwhile.
      error = err;
    }
  }
  if (!w.queued.has(p.holdId)) {
    w.queued.add(p.holdId);
    w.queue.push(p);
  }
  if (error !== undefined) failed(w, error);
  else {
    report(w);
    schedule(w);
  }
  return undefined;
}

/** {@link StoreWrites.close}: stops the timer, one last drain, and reports what is left. */
async function closeWatch(w: Watch): Promise<void> {
  w.closed = true;
  if (w.timer !== undefined) clearTimeout(w.timer);
  w.timer = undefined;
  await w.draining;
  if (w.queue.length > 0) await drain(w);
  if (w.queue.length > 0) {
    const late = w.queue.filter((p) => p.kind === "late").length;
    w.options.onError(
      new Error(
        `Budget ledger: ${w.queue.length} settles (${pendingTokens(w)} tokens used) could not be written ` +
          "before the close: their Holds stay open in the store and are reclaimed at their expiry " +
          "(or at the next start), charged what their last renewal recorded" +
          (late === 0 ? "" : `; ${late} of them late charges of lost leases' Holds, not charged`),
      ),
    );
  }
}

/**
 * Watches the writes of `inner`: while one has failed and none succeeded since, or settles wait,
 * the ledger is not writable (`/readyz` 503). While it is not, one unref'd timer tries again —
 * the oldest pending settle, or else {@link BudgetStore.probeWrite} — after 50 ms, doubling up to
 * 1 s between tries; any write that succeeds meanwhile (a Hold, a lease step) starts writing the
 * pending settles at once.
 */
export function watchStoreWrites(inner: BudgetStore, options: StoreWritesOptions): StoreWrites {
  const w: Watch = {
    inner,
    options,
    maxPending: options.maxPendingSettles ?? MAX_PENDING_SETTLES,
    queue: [],
    queued: new Set<string>(),
    store: inner,
    failing: false,
    reported: true,
    lastError: undefined,
    retries: 0,
    timer: undefined,
    draining: undefined,
    closed: false,
  };
  w.store = watchedStore(w);
  return {
    store: w.store,
    get writable() {
      return isWritable(w);
    },
    get pendingSettles() {
      return w.queue.length;
    },
    get full() {
      return w.queue.length >= w.maxPending;
    },
    async settle(holdId, usedTokens) {
      const done = await writeOrKeep<SettleResult | undefined>(w, { kind: "settle", holdId, usedTokens });
      return done === undefined ? { outcome: "pending", chargedTokens: 0, releasedTokens: 0 } : done.written;
    },
    async chargeLate(input) {
      const done = await writeOrKeep<number>(w, { kind: "late", holdId: input.holdId, input });
      return done === undefined ? "pending" : done.written;
    },
    close: () => closeWatch(w),
  };
}
