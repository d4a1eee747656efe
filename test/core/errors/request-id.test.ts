// Ids from the pooled random bytes: the contract's form, and never one twice (across refills).
import { describe, expect, it } from "vitest";
import { isRequestId, newRequestId, randomHex32 } from "../../../src/core/errors/index.js";

describe("randomHex32 and newRequestId", () => {
  it("give 32 lowercase hex, all different, over many refills of the pool", () => {
    const seen = new Set<string>();
    for (let i = 0; i < 5000; i++) {
      const hex = randomHex32();
      expect(hex).toMatch(/^[0-9a-f]{32}$/);
      seen.add(hex);
    }
    expect(seen.size).toBe(5000);
    const id = newRequestId();
    expect(isRequestId(id)).toBe(true);
    expect(seen.has(id.slice(4))).toBe(false);
  });
});
