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

/**
 * Watches the writes of `inner`: while one has failed and none succeeded since, or settles wait,
 * the ledger is not writable (`/readyz` 503). While it is not, one unref'd timer tries again —
 * the oldest pending settle, or else {@link BudgetStore.probeWrite} — after 50 ms, doubling up to
 * 1 s between tries; any write that succeeds meanwhile (a Hold, a lease step) starts writing the
 * pending settles at once.
 */
export function watchStoreWrites(inner: BudgetStore, options: StoreWritesOptions): StoreWrites {
  const maxPending = options.maxPendingSettles ?? MAX_PENDING_SETTLES;
  const queue: PendingWrite[] = [];
  const queued = new Set<string>();
  let failing = false;
  let reported = true; // what onWritableChange last said
  let lastError: unknown;
  let retries = 0;
  let timer: NodeJS.Timeout | undefined;
  let draining: Promise<void> | undefined;
  let closed = false;

  const pendingTokens = () => queue.reduce((sum, p) => sum + tokensOf(p), 0);
  const writable = () => !failing && queue.length === 0;
  const report = (): void => {
    const now = writable();
    if (now === reported) return;
    reported = now;
    options.onWritableChange?.({
      writable: now,
      pendingSettles: queue.length,
      pendingTokens: pendingTokens(),
      ...(now ? {} : { error: lastError }),
    });
  };

  const schedule = (): void => {
    if (closed || timer !== undefined || writable()) return;
    const delay = Math.min(WRITE_RETRY_MAX_MS, WRITE_RETRY_MIN_MS * 2 ** Math.min(retries, 10));
    retries++;
    timer = setTimeout(() => {
      timer = undefined;
      if (queue.length > 0) void drain();
      else void store.probeWrite().catch(() => undefined); // its outcome is noted by the wrapper
    }, delay);
    timer.unref();
  };

  const wrote = (): void => {
    failing = false;
    retries = 0;
    if (queue.length > 0) void drain();
    else report();
  };
  const failed = (err: unknown): void => {
    failing = true;
    lastError = err;
    report();
    schedule();
  };

  const store: BudgetStore = { ...inner };
  for (const name of WRITES) {
    const write = (inner[name] as (...args: unknown[]) => Promise<unknown>).bind(inner);
    (store as unknown as Record<string, unknown>)[name] = async (...args: unknown[]) => {
      let result: unknown;
      try {
        result = await write(...args);
      } catch (err) {
        failed(err);
        throw err;
      }
      wrote();
      return result;
    };
  }

  /** One pending write, to the store itself (not the watched wrapper). */
  async function writeOne(p: PendingWrite): Promise<SettleResult | number | undefined> {
    const t = options.now();
    const day = options.dayOf(t);
    return p.kind === "settle"
      ? inner.settleHold(p.holdId, p.usedTokens, t, day)
      : inner.chargeLate({ ...p.input, now: t, day });
  }

  /** Writes the pending writes in order, up to the first that fails (then tried again later). */
  function drain(): Promise<void> {
    draining ??= (async () => {
      try {
        while (queue.length > 0) {
          const p = queue[0] as PendingWrite;
          let result: SettleResult | number | undefined;
          try {
            result = await writeOne(p);
          } catch (err) {
            failing = true;
            lastError = err;
            schedule();
            return;
          }
          queue.shift();
          queued.delete(p.holdId);
          if (result === undefined) {
            options.onError(
              new Error(
                `Budget ledger: the settle of Hold ${p.holdId} (${tokensOf(p)} tokens used) found no such Hold: ` +
                  "it was closed and purged while the settle waited; nothing was charged",
              ),
            );
          }
        }
        failing = false;
        retries = 0;
      } finally {
        draining = undefined;
        report();
      }
    })();
    return draining;
  }

  /**
   * Writes `p` now when nothing waits; else, or when the store fails it, keeps it at the end of the
   * queue (once per Hold id) and answers undefined: written later, in order.
   */
  async function writeOrKeep<T extends SettleResult | number | undefined>(
    p: PendingWrite,
  ): Promise<{ written: T } | undefined> {
    let error: unknown;
    if (queue.length === 0) {
      try {
        const written = (await writeOne(p)) as T;
        wrote();
        return { written };
      } catch (err) {
        // Kept below and written again; the Hold stays open (reserved) in the store meanwhile.
        error = err;
      }
    }
    if (!queued.has(p.holdId)) {
      queued.add(p.holdId);
      queue.push(p);
    }
    if (error !== undefined) failed(error);
    else {
      report();
      schedule();
    }
    return undefined;
  }

  return {
    store,
    get writable() {
      return writable();
    },
    get pendingSettles() {
      return queue.length;
    },
    get full() {
      return queue.length >= maxPending;
    },
    async settle(holdId, usedTokens) {
      const done = await writeOrKeep<SettleResult | undefined>({ kind: "settle", holdId, usedTokens });
      return done === undefined ? { outcome: "pending", chargedTokens: 0, releasedTokens: 0 } : done.written;
    },
    async chargeLate(input) {
      const done = await writeOrKeep<number>({ kind: "late", holdId: input.holdId, input });
      return done === undefined ? "pending" : done.written;
    },
    async close() {
      closed = true;
      if (timer !== undefined) clearTimeout(timer);
      timer = undefined;
      await draining;
      if (queue.length > 0) await drain();
      if (queue.length > 0) {
        const late = queue.filter((p) => p.kind === "late").length;
        options.onError(
          new Error(
            `Budget ledger: ${queue.length} settles (${pendingTokens()} tokens used) could not be written ` +
              "before the close: their Holds stay open in the store and are reclaimed at their expiry " +
              "(or at the next start), charged what their last renewal recorded" +
              (late === 0 ? "" : `; ${late} of them late charges of lost leases' Holds, not charged`),
          ),
        );
      }
    },
  };
}
