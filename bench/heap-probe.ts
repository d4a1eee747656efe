/**
 * A test-only hook for `npm run soak`, never loaded by the gateway itself: preloaded into a gateway
 * child process (`node --expose-gc --import tsx --import ./bench/heap-probe.ts src/main.ts`, with an
 * IPC channel), it answers each `"probe"` message with the process's memory after a full garbage
 * collection: `{heapUsed, rss, maxRss}` in bytes (maxRss: the peak resident set since start).
 */
import { setImmediate as nextTurn } from "node:timers/promises";

/** What the probe answers. All in bytes. */
export interface HeapReading {
  /** V8 heap in use after two full collections. */
  heapUsed: number;
  /** Resident set size now. */
  rss: number;
  /** Peak resident set size since the process started. */
  maxRss: number;
}

const collect = (globalThis as { gc?: () => void }).gc;
if (collect === undefined || process.send === undefined) {
  throw new Error("heap-probe needs --expose-gc and an IPC channel");
}
const send = process.send.bind(process);

process.on("message", (message: unknown) => {
  if (message !== "probe") return;
  void (async () => {
    // Twice, a turn apart: WeakRef targets and finalizers of the first pass go in the second.
    collect();
    await nextTurn();
    collect();
    const reading: HeapReading = {
      heapUsed: process.memoryUsage().heapUsed,
      rss: process.memoryUsage.rss(),
      maxRss: process.resourceUsage().maxRSS * 1024,
    };
    send(reading);
  })();
});
