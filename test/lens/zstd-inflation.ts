// Counts what zstd-napi's streaming decoder does while a test runs, so that a test can assert how
// much a frame was inflated (bytes produced, input consumed) instead of how long it took.
import { vi } from "vitest";
import binding from "zstd-napi/binding.js";

/** What every `DCtx.decompressStream` call did since {@link watchInflation} started, summed. */
export interface Inflation {
  /** decompressStream calls. */
  readonly calls: number;
  /** Decompressed bytes written, into the output buffer or anywhere else. */
  readonly produced: number;
  /** Compressed bytes read. */
  readonly consumed: number;
  /** Stops counting (restores the binding's own method). */
  stop(): void;
}

/** Wraps zstd-napi's `DCtx.prototype.decompressStream` (the library, not our code) with a counter. */
export function watchInflation(): Inflation {
  const spy = vi.spyOn(binding.DCtx.prototype, "decompressStream");
  const sum = (index: 1 | 2) =>
    spy.mock.results.reduce((total, r) => total + (r.type === "return" ? r.value[index] : 0), 0);
  return {
    get calls() {
      return spy.mock.calls.length;
    },
    get produced() {
      return sum(1);
    },
    get consumed() {
      return sum(2);
    },
    stop: () => spy.mockRestore(),
  };
}
