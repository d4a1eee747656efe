import { describe, expect, it } from "vitest";
import { createTokenizeCache } from "../../src/upstream/index.js";

const entry = (n: number) => ({ tokens: Array.from({ length: n }, (_, i) => i), maxModelLen: 8192 });

describe("createTokenizeCache", () => {
  it("keys by model, add_special_tokens and prompt", () => {
    const c = createTokenizeCache();
    c.set("m", true, "hi", entry(2));
    expect(c.get("m", true, "hi")?.tokens).toStrictEqual([0, 1]);
    expect(c.get("m", false, "hi")).toBeUndefined();
    expect(c.get("m2", true, "hi")).toBeUndefined();
    expect(c.get("m", true, "hi ")).toBeUndefined();
    // No ambiguity between model and prompt parts of the key.
    c.set("a\u00000", true, "b", entry(1));
    expect(c.get("a", true, "0\u0000b")).toBeUndefined();
  });

  it("evicts the least recently used entry beyond maxEntries", () => {
    const c = createTokenizeCache({ maxEntries: 2 });
    c.set("m", true, "a", entry(1));
    c.set("m", true, "b", entry(1));
    c.get("m", true, "a"); // a is now the most recent
    c.set("m", true, "c", entry(1));
    expect(c.get("m", true, "b")).toBeUndefined();
    expect(c.get("m", true, "a")).toBeDefined();
    expect(c.get("m", true, "c")).toBeDefined();
    expect(c.size).toBe(2);
  });

  it("stays within maxBytes and skips an entry larger than the whole cache", () => {
    const c = createTokenizeCache({ maxBytes: 2000 });
    for (let i = 0; i < 50; i++) c.set("m", true, `p${i}`, entry(20));
    expect(c.bytes).toBeLessThanOrEqual(2000);
    expect(c.size).toBeGreaterThan(0);
    expect(c.get("m", true, "p49")).toBeDefined();
    expect(c.get("m", true, "p0")).toBeUndefined();
    c.set("m", true, "huge", entry(1000));
    expect(c.get("m", true, "huge")).toBeUndefined();
    expect(c.bytes).toBeLessThanOrEqual(2000);
  });

  it("replacing an entry keeps the byte count right", () => {
    const c = createTokenizeCache();
    c.set("m", true, "a", entry(10));
    const before = c.bytes;
    c.set("m", true, "a", entry(10));
    expect(c.bytes).toBe(before);
    expect(c.size).toBe(1);
  });
});
