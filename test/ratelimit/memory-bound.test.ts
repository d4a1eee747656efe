// The memory store's bound (src/ratelimit/memory-store.ts): a scope idle for 60 s is dropped, and
// past maxScopes the least recently reserved scope is forgotten.
import { describe, expect, it } from "vitest";
import { createMemoryRateLimitStore } from "../../src/ratelimit/memory-store.js";
import { T0 } from "./helpers.js";

describe("the memory store's bound", () => {
  it("drops the scopes idle for 60 s", async () => {
    const store = createMemoryRateLimitStore();
    for (let i = 0; i < 1000; i++) await store.reserve([{ id: `k${i}`, limits: {} }], "r", 1, T0 + i);
    expect(store.scopeCount()).toBe(1000);
    await store.reserve([{ id: "late", limits: {} }], "r", 1, T0 + 500 + 60_000);
    expect(store.scopeCount()).toBe(1 + 499); // k0 … k500 had nothing left in their windows
    await store.reserve([{ id: "later", limits: {} }], "r", 1, T0 + 999 + 60_000);
    expect(store.scopeCount()).toBe(2);
  });

  it("forgets the least recently reserved scope past maxScopes", async () => {
    const store = createMemoryRateLimitStore({ maxScopes: 2 });
    const limits = { requestsPerMinute: 1 };
    await store.reserve([{ id: "a", limits }], "1", 0, T0);
    await store.reserve([{ id: "b", limits }], "1", 0, T0);
    expect((await store.reserve([{ id: "a", limits }], "2", 0, T0)).admitted).toBe(false);
    // A refusal admits nothing, so a is still the least recently reserved: c's scope evicts it.
    await store.reserve([{ id: "c", limits }], "1", 0, T0);
    expect(store.scopeCount()).toBe(2);
    expect((await store.reserve([{ id: "b", limits }], "2", 0, T0)).admitted).toBe(false);
    expect((await store.reserve([{ id: "a", limits }], "3", 0, T0)).admitted).toBe(true);
  });

  it("counts an admitted reserve as a use: its scope becomes the most recent", async () => {
    const store = createMemoryRateLimitStore({ maxScopes: 2 });
    const limits = { requestsPerMinute: 2 };
    await store.reserve([{ id: "a", limits }], "1", 0, T0);
    await store.reserve([{ id: "b", limits }], "1", 0, T0);
    await store.reserve([{ id: "a", limits }], "2", 0, T0); // b is now the least recently reserved
    await store.reserve([{ id: "c", limits }], "1", 0, T0);
    expect((await store.reserve([{ id: "a", limits }], "3", 0, T0)).admitted).toBe(false); // a kept its 2
    expect((await store.reserve([{ id: "b", limits }], "2", 0, T0)).requests).toMatchObject({ remaining: 1 });
  });
});
