// ledger.standing() for Holds in the store (SQLite, and PostgreSQL at the end of a Budget or
// with leases off): a Hold whose expiry the store confirmed recently is vouched for without a
// promise; one near or past that expiry (its replica stalled, or could not reach the store) is
// renewed first, and one reclaimed meanwhile by another process (its tokens given back to the
// Budget) is not vouched for. Clock-driven, both stores (src/budget/README.md, "What a crash costs").
import { describe, expect, it } from "vitest";
import type { BudgetLedgerOptions, BudgetStore } from "../../src/budget/index.js";
import { clockedLedgers, storesUnderTest } from "./helpers.js";

const HOLD_TTL = 60_000;

describe.each(storesUnderTest("hold_fence"))("store Hold fence on $kind", (store) => {
  const { clock, open, rawStore } = clockedLedgers(store, { holdTtlMs: HOLD_TTL, leases: false });
  const demand = (maxTokens: number) => ({ promptTokens: 0, prompts: 1, n: 1, maxTokens });
  /** A key with `budgetTokens`, a ledger `a` holding 100 of them, and another process's ledger. */
  const heldOnA = async (budgetTokens: number, aOptions: Partial<BudgetLedgerOptions> = {}) => {
    const other = await open({ instanceId: "other" });
    const a = await open({ instanceId: "a", ...aOptions });
    const { id, key } = await other.createKey({ budgetTokens });
    const held = await a.placeHold(await a.authenticate(`Bearer ${key}`), demand(100));
    return { other, a, id, key, holdId: held.holdId };
  };

  it("a Hold renewed on schedule is vouched for without a promise, and its renewals keep it so", async () => {
    const { a, holdId } = await heldOnA(1000);
    for (let minute = 0; minute < 5; minute++) {
      expect(a.standing(holdId), `minute ${minute}`).toBe(true);
      clock.now += (HOLD_TTL / 4) * 2; // half a TTL between renewals (a stream renews far more often)
      expect(a.standing(holdId), `minute ${minute}, before the renewal`).toBe(true);
      expect(await a.renew(holdId, 10)).toBe(true);
    }
  });

  it("a Hold past three quarters of its TTL without a renewal (a stall) is renewed in the store before it is vouched for", async () => {
    const { other, a, id, holdId } = await heldOnA(1000);
    clock.now += (3 * HOLD_TTL) / 4 + 1;
    const standing = a.standing(holdId);
    expect(standing).toBeInstanceOf(Promise);
    expect(await standing).toBe(true);
    // The store's row now expires a TTL after the check: another process reclaims nothing at the
    // Hold's first expiry, and the tokens stay held.
    clock.now += HOLD_TTL / 4 + 1;
    expect(await other.reclaimStale()).toMatchObject({ holds: 0 });
    expect(await other.usage(id)).toMatchObject({ heldTokens: 100, openHolds: 1 });
    expect(a.standing(holdId)).toBe(true);
  });

  it("a stall past the expiry with the Hold not yet reclaimed: still the request's (nothing was given back)", async () => {
    const { other, a, id, holdId } = await heldOnA(1000);
    clock.now += 3 * HOLD_TTL;
    expect(await a.standing(holdId)).toBe(true);
    expect(await other.reclaimStale()).toMatchObject({ holds: 0 });
    await a.settle(holdId, 40);
    expect(await other.usage(id)).toMatchObject({ spentTokens: 40, heldTokens: 0, openHolds: 0 });
  });

  it("a Hold reclaimed by another process while its replica stalled is not vouched for; its settle charges what the Budget has free", async () => {
    const { other, a, id, key, holdId } = await heldOnA(1000);
    await a.renew(holdId, 30); // recorded: a reclaim charges 30
    clock.now += HOLD_TTL + 1; // the replica stalls past its Hold's expiry
    expect(await other.reclaimStale()).toMatchObject({ holds: 1 });
    // The 70 tokens given back are spent by other requests: the Budget is gone.
    const rest = await other.placeHold(await other.authenticate(`Bearer ${key}`), demand(970));
    expect(rest).toMatchObject({ heldTokens: 970 });
    const standing = a.standing(holdId);
    expect(standing).toBeInstanceOf(Promise);
    expect(await standing).toBe(false); // before the fence: true, and the request went on delivering
    // Asked again (the next chunk): still not vouched for, until its settle.
    expect(await a.standing(holdId)).toBe(false);
    await other.settle(rest.holdId, 970);
    await a.settle(holdId, 60);
    expect(await other.usage(id)).toMatchObject({ spentTokens: 1000, heldTokens: 0, openHolds: 0 });
  });

  it("a renewal whose answer is read after the margin (a stall while it was in flight) is asked again", async () => {
    const inner = await rawStore();
    let stalls = 1;
    let renewals = 0;
    const wrapped: BudgetStore = {
      ...inner,
      async renewHold(holdId, expiresAt, usedTokens) {
        const renewed = await inner.renewHold(holdId, expiresAt, usedTokens);
        renewals++;
        if (stalls > 0) {
          stalls--;
          clock.now += HOLD_TTL; // committed; the replica stalls before reading the answer
        }
        return renewed;
      },
    };
    const { a, holdId } = await heldOnA(1000, { store: wrapped } as Partial<BudgetLedgerOptions>);
    clock.now += (3 * HOLD_TTL) / 4 + 1;
    expect(await a.standing(holdId)).toBe(true);
    expect(renewals).toBe(2); // the late answer vouched for nothing: renewed once more
    stalls = 3;
    clock.now += (3 * HOLD_TTL) / 4 + 1;
    await expect(a.standing(holdId)).rejects.toThrow(/come too late/);
    expect(renewals).toBe(5);
  });

  it("a store that does not answer fails the check (rejects) within what is left of the Hold's life, not never", async () => {
    const inner = await rawStore();
    let silent = false;
    const wrapped: BudgetStore = {
      ...inner,
      renewHold: (holdId, expiresAt, usedTokens) =>
        silent ? new Promise<boolean>(() => undefined) : inner.renewHold(holdId, expiresAt, usedTokens),
    };
    // A Hold TTL of 400 ms of the ledger's clock: past the expiry, the wait is an eighth of it (50 ms).
    const { a, holdId } = await heldOnA(1000, {
      store: wrapped,
      holdTtlMs: 400,
    } as Partial<BudgetLedgerOptions>);
    silent = true;
    clock.now += 401;
    await expect(a.standing(holdId)).rejects.toThrow(/was not renewed within 50 ms/);
  });

  it("a renewal with a shorter TTL than the Hold had is what the check goes by (the store keeps the renewal's expiry)", async () => {
    const { other, a, id, holdId } = await heldOnA(1000);
    expect(await a.renew(holdId, 10, 4000)).toBe(true); // the store's row now expires in 4 s
    clock.now += 3001; // past three quarters of that: the ledger must not go by the first 60 s
    const standing = a.standing(holdId);
    expect(standing).toBeInstanceOf(Promise);
    expect(await standing).toBe(true);
    clock.now += 3000; // past the renewal's expiry (4 s), within the check's own (4 s after it)
    expect(await other.reclaimStale()).toMatchObject({ holds: 0 }); // renewed by the check
    expect(await other.usage(id)).toMatchObject({ heldTokens: 100 });
  });

  it("a settled Hold is forgotten: asked after its settle, it is vouched for at once", async () => {
    const { a, holdId } = await heldOnA(1000);
    await a.settle(holdId, 5);
    clock.now += 10 * HOLD_TTL;
    expect(a.standing(holdId)).toBe(true);
  });
});
