// A Connect stream whose caller stops taking messages is ended: its source closed at once (a
// generator's finally runs: Inference aborted, the Hold settled), whatever the consumer does later.
import { describe, expect, it, vi } from "vitest";
import { endWhenStalled } from "../../../src/surfaces/rpc/index.js";

/** A source of n items that records how it ended. */
function source(n: number) {
  const seen = { finished: false, closedEarly: false };
  async function* gen(): AsyncGenerator<number> {
    let done = false;
    try {
      for (let i = 0; i < n; i++) yield i;
      done = true;
    } finally {
      if (done) seen.finished = true;
      else seen.closedEarly = true;
    }
  }
  return { gen: gen(), seen };
}

describe("endWhenStalled", () => {
  it("passes every item through to a consumer that keeps pulling, however long it takes in all", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const { gen, seen } = source(5);
      let stalls = 0;
      const out: number[] = [];
      for await (const x of endWhenStalled(gen, 1000, () => stalls++)) {
        out.push(x);
        vi.advanceTimersByTime(900); // 4,500 ms in all: each wait is under 1,000
      }
      expect(out).toEqual([0, 1, 2, 3, 4]);
      expect(stalls).toBe(0);
      expect(seen).toEqual({ finished: true, closedEarly: false });
    } finally {
      vi.useRealTimers();
    }
  });

  it("closes the source and calls onStall once when the consumer does not pull for stallMs", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const { gen, seen } = source(100);
      let stalls = 0;
      const it = endWhenStalled(gen, 1000, () => stalls++);
      expect((await it.next()).value).toBe(0);
      vi.advanceTimersByTime(999);
      expect(stalls).toBe(0);
      vi.advanceTimersByTime(1);
      expect(stalls).toBe(1);
      await new Promise((r) => setImmediate(r)); // the source's return() settles in microtasks
      expect(seen.closedEarly).toBe(true);
      // A consumer that pulls at last (or is thrown into) sees the end, nothing more.
      expect(await it.next()).toEqual({ done: true, value: undefined });
      vi.advanceTimersByTime(5000);
      expect(stalls).toBe(1);
    } finally {
      vi.useRealTimers();
    }
  });

  it("closing it early closes the source (a caller that went away)", async () => {
    const { gen, seen } = source(100);
    const it = endWhenStalled(gen, 60_000, () => {});
    await it.next();
    await it.return(undefined);
    expect(seen.closedEarly).toBe(true);
  });
});
