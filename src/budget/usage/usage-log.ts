// The usage log: one record per settled request, queued in memory and written in batches — one
// multi-row INSERT per flush, off the request path (src/budget/README.md, "Usage records").
import type { BudgetStore } from "../budget-store.js";
import { MAX_USAGE_ROWS_PER_INSERT } from "../stores/usage-sql.js";
import type { UsageRecord } from "./usage-record.js";

/** What the service hands the log when a request has settled (the record less what the log fills in). */
export interface UsageEntry extends Omit<UsageRecord, "chargedTokens" | "createdAt"> {
  /** What the Hold's settle answered (`LedgerSettleResult`); undefined when it threw. */
  readonly settled: unknown;
  /** The tokens the settle was asked to charge (the usage meter's charge). */
  readonly usedTokens: number;
  /** The tokens the Hold held. */
  readonly heldTokens: number;
}

/** Options of {@link createUsageLog}. */
export interface UsageLogOptions {
  /** Longest wait of a queued record before its flush, ms. @default 100 */
  readonly flushIntervalMs?: number;
  /** Rows that start a flush at once (and the most one flush writes). @default 500 */
  readonly batchRows?: number;
  /** Most records queued; past it a new record is dropped (counted, logged). @default 100000 */
  readonly maxQueued?: number;
  /** The clock of `created_at`, Unix epoch ms. @default Date.now */
  readonly now?: () => number;
  /** Told when records are dropped or a flush fails. @default process.emitWarning */
  readonly onProblem?: (message: string, err?: unknown) => void;
}

/** The usage log of one ledger. */
export interface UsageLog {
  /** Queues the record of a settled request; never blocks, never throws (dropped past the bound). */
  record(entry: UsageEntry): void;
  /** Writes what is queued now (resolves once written, or once the flush failed: kept, tried later). */
  flush(): Promise<void>;
  /** Stops the timer and writes everything queued; what cannot be written is reported and lost. */
  close(): Promise<void>;
  /** Records queued, not yet written. */
  readonly queued: number;
  /** Records dropped because the queue was full (or left unwritten at close). */
  readonly dropped: number;
  /** Records written. */
  readonly written: number;
  /** Flushes that wrote (each one INSERT per 500 rows). */
  readonly flushes: number;
}

/**
 * The tokens the settle charged: its answer's `chargedTokens`; for a settle kept `pending` (the
 * store could not write it yet), what it will charge when written — min(used, held), the settle's
 * rule (README, settle); 0 when the settle threw (the Hold is reclaimed later, charged its renewal).
 */
export function chargedOf(settled: unknown, usedTokens: number, heldTokens: number): number {
  const s = settled as { outcome?: unknown; chargedTokens?: unknown } | undefined;
  if (s === undefined || s === null || typeof s.chargedTokens !== "number") return 0;
  return s.outcome === "pending" ? Math.min(usedTokens, heldTokens) : s.chargedTokens;
}

/** The state of one log. */
interface LogState {
  readonly store: BudgetStore;
  readonly intervalMs: number;
  readonly batchRows: number;
  readonly maxQueued: number;
  readonly now: () => number;
  readonly onProblem: (message: string, err?: unknown) => void;
  queue: UsageRecord[];
  timer: NodeJS.Timeout | undefined;
  /** The flush under way: one at a time. */
  flushing: Promise<void> | undefined;
  closed: boolean;
  dropped: number;
  /** Dropped since the last report (reported once per flush interval at most). */
  droppedUnreported: number;
  written: number;
  flushes: number;
}

/** Writes up to batchRows of the queue's head; on failure they go back to its head (tried again). */
async function flushOnce(s: LogState): Promise<boolean> {
  const batch = s.queue.splice(0, s.batchRows);
  if (batch.length === 0) return true;
  try {
    await s.store.insertUsage(batch);
    s.written += batch.length;
    s.flushes++;
    return true;
  } catch (err) {
    s.queue = batch.concat(s.queue);
    s.onProblem(`usage log: a flush of ${batch.length} records failed; kept, tried again`, err);
    return false;
  }
}

/** Flushes (one at a time), then again at once while a full batch waits, else later if any wait. */
function flush(s: LogState): Promise<void> {
  if (s.timer !== undefined) clearTimeout(s.timer);
  s.timer = undefined;
  s.flushing ??= (async () => {
    reportDrops(s);
    let ok = await flushOnce(s);
    while (ok && s.queue.length >= s.batchRows) ok = await flushOnce(s);
  })().finally(() => {
    s.flushing = undefined;
    if (s.queue.length > 0 && !s.closed) schedule(s);
  });
  return s.flushing;
}

/** Arms the flush timer (unref'd) unless armed or a flush is under way. */
function schedule(s: LogState): void {
  if (s.timer !== undefined || s.flushing !== undefined) return;
  s.timer = setTimeout(() => void flush(s), s.intervalMs);
  s.timer.unref();
}

function reportDrops(s: LogState): void {
  if (s.droppedUnreported === 0) return;
  s.onProblem(
    `usage log: ${s.droppedUnreported} records dropped (queue full at ${s.maxQueued}; ${s.dropped} in all)`,
  );
  s.droppedUnreported = 0;
}

/** Queues one record: the batch's end starts a flush now, else the timer does. */
function record(s: LogState, entry: UsageEntry): void {
  if (s.closed || s.queue.length >= s.maxQueued) {
    s.dropped++;
    s.droppedUnreported++;
    if (s.closed) reportDrops(s);
    else schedule(s);
    return;
  }
  const { settled, usedTokens, heldTokens, ...rest } = entry;
  s.queue.push({ ...rest, chargedTokens: chargedOf(settled, usedTokens, heldTokens), createdAt: s.now() });
  if (s.queue.length >= s.batchRows && s.flushing === undefined) void flush(s);
  else schedule(s);
}

/** Writes everything queued (one try per batch after the flush under way); reports what is left. */
async function close(s: LogState): Promise<void> {
  if (s.closed) return;
  s.closed = true;
  if (s.timer !== undefined) clearTimeout(s.timer);
  s.timer = undefined;
  await s.flushing;
  while (s.queue.length > 0 && (await flushOnce(s)));
  reportDrops(s);
  const left = s.queue.length;
  s.queue = [];
  s.dropped += left;
  if (left > 0) s.onProblem(`usage log: ${left} records could not be written before the close; lost`);
}

/**
 * The usage log over `store`: {@link UsageLog.record} queues in memory (no I/O, so no round trip
 * on the request path); a flush writes the queue's head in one multi-row INSERT — `flushIntervalMs`
 * after the first record queued, or at once when `batchRows` wait. A flush that fails keeps its
 * records at the queue's head and is tried again at the next interval; past `maxQueued` records
 * new ones are dropped, counted and logged (never blocking a request). `close()` writes what is
 * queued. A crash loses what is queued: at most the last flush interval's records (more only
 * while the store fails to write).
 */
export function createUsageLog(store: BudgetStore, options: UsageLogOptions = {}): UsageLog {
  const s: LogState = {
    store,
    intervalMs: options.flushIntervalMs ?? 100,
    batchRows: Math.min(options.batchRows ?? MAX_USAGE_ROWS_PER_INSERT, MAX_USAGE_ROWS_PER_INSERT),
    maxQueued: options.maxQueued ?? 100_000,
    now: options.now ?? Date.now,
    onProblem:
      options.onProblem ??
      ((message, err) => process.emitWarning(err === undefined ? message : `${message}: ${String(err)}`)),
    queue: [],
    timer: undefined,
    flushing: undefined,
    closed: false,
    dropped: 0,
    droppedUnreported: 0,
    written: 0,
    flushes: 0,
  };
  return {
    record: (entry) => record(s, entry),
    flush: () => flush(s),
    close: () => close(s),
    get queued() {
      return s.queue.length;
    },
    get dropped() {
      return s.dropped;
    },
    get written() {
      return s.written;
    },
    get flushes() {
      return s.flushes;
    },
  };
}
