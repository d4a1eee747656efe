// One scope's sliding window log in memory: entries sorted by time, the running count and token
// total, expired entries dropped from the head as time goes (each once: O(1) amortised), a
// released entry marked dead in place and skipped.
import { leavesInMs } from "./decision.js";
import { WINDOW_MS } from "./rate-limit-store.js";

interface Entry {
  readonly id: string;
  readonly atMs: number;
  tokens: number;
  live: boolean;
}

export class MemoryWindow {
  private entries: Entry[] = [];
  private head = 0;
  private readonly byId = new Map<string, Entry>();
  count = 0;
  tokens = 0;
  /** The newest reserve's time: the window is idle (empty) once it is WINDOW_MS old. */
  lastReserveMs = 0;

  /** Drops the entries with atMs ≤ nowMs − WINDOW_MS. */
  expire(nowMs: number): void {
    const cutoff = nowMs - WINDOW_MS;
    while (this.head < this.entries.length) {
      const entry = this.entries[this.head] as Entry;
      if (entry.atMs > cutoff) break;
      if (entry.live) this.drop(entry);
      this.head++;
    }
    if (this.head > 1024 && this.head * 2 > this.entries.length) {
      this.entries = this.entries.slice(this.head);
      this.head = 0;
    }
  }

  has(id: string): boolean {
    return this.byId.has(id);
  }

  add(id: string, tokens: number, atMs: number): void {
    const entry: Entry = { id, atMs, tokens, live: true };
    let at = this.entries.length;
    while (at > this.head && (this.entries[at - 1] as Entry).atMs > atMs) at--; // a clock behind: rare
    if (at === this.entries.length) this.entries.push(entry);
    else this.entries.splice(at, 0, entry);
    this.byId.set(id, entry);
    this.count++;
    this.tokens += tokens;
    this.lastReserveMs = Math.max(this.lastReserveMs, atMs);
  }

  correct(id: string, tokens: number): void {
    const entry = this.byId.get(id);
    if (entry === undefined) return;
    this.tokens += tokens - entry.tokens;
    entry.tokens = tokens;
  }

  release(id: string): void {
    const entry = this.byId.get(id);
    if (entry !== undefined) this.drop(entry);
  }

  private drop(entry: Entry): void {
    entry.live = false;
    this.byId.delete(entry.id);
    this.count--;
    this.tokens -= entry.tokens;
  }

  newestMs(): number | undefined {
    for (let i = this.entries.length - 1; i >= this.head; i--) {
      const entry = this.entries[i] as Entry;
      if (entry.live) return entry.atMs;
    }
    return undefined;
  }

  /** ms until one more request fits `limit` (0: it fits now). */
  waitRequests(limit: number | undefined, nowMs: number): number {
    if (limit === undefined || this.count + 1 <= limit) return 0;
    let toLeave = this.count + 1 - limit;
    for (let i = this.head; i < this.entries.length; i++) {
      const entry = this.entries[i] as Entry;
      if (entry.live && --toLeave === 0) return leavesInMs(entry.atMs, nowMs);
    }
    return WINDOW_MS;
  }

  /** ms until `tokens` more fit `limit` (0: now; Infinity: more than the limit itself). */
  waitTokens(limit: number | undefined, tokens: number, nowMs: number): number {
    if (limit === undefined || this.tokens + tokens <= limit) return 0;
    if (tokens > limit) return Number.POSITIVE_INFINITY;
    let toFree = this.tokens + tokens - limit;
    for (let i = this.head; i < this.entries.length; i++) {
      const entry = this.entries[i] as Entry;
      if (!entry.live) continue;
      toFree -= entry.tokens;
      if (toFree <= 0) return leavesInMs(entry.atMs, nowMs);
    }
    return WINDOW_MS;
  }
}
