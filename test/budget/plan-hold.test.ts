import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { demandTokens, planHold } from "../../src/budget/index.js";

describe("planHold", () => {
  it.each([
    // available, demand, plan
    [1000, [30, 2, 3, 50], { kind: "hold", tokens: 330, maxTokens: 50, clamped: false }],
    [330, [30, 2, 3, 50], { kind: "hold", tokens: 330, maxTokens: 50, clamped: false }],
    [329, [30, 2, 3, 50], { kind: "hold", tokens: 324, maxTokens: 49, clamped: true }],
    [36, [30, 2, 3, 50], { kind: "hold", tokens: 36, maxTokens: 1, clamped: true }],
    [35, [30, 2, 3, 50], { kind: "insufficient", minimumTokens: 36 }],
    [0, [0, 1, 1, 1], { kind: "insufficient", minimumTokens: 1 }],
    [-50, [0, 1, 1, 1], { kind: "insufficient", minimumTokens: 1 }],
    [1, [0, 1, 1, 16], { kind: "hold", tokens: 1, maxTokens: 1, clamped: true }],
    [20, [25, 1, 1, 16], { kind: "insufficient", minimumTokens: 26 }],
  ] as const)("available %i, demand %j → %o", (available, [promptTokens, prompts, n, maxTokens], plan) => {
    expect(planHold(available, { promptTokens, prompts, n, maxTokens })).toEqual(plan);
  });

  it("never holds more than is available, and clamps to the largest max_tokens that fits", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: -1000, max: 200_000 }),
        fc.integer({ min: 0, max: 40_000 }),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 1, max: 128 }),
        fc.integer({ min: 1, max: 32_000 }),
        (available, promptTokens, prompts, n, maxTokens) => {
          const plan = planHold(available, { promptTokens, prompts, n, maxTokens });
          const per = prompts * n;
          if (plan.kind === "insufficient") {
            expect(promptTokens + per).toBeGreaterThan(available);
            expect(plan.minimumTokens).toBe(promptTokens + per);
            return;
          }
          if (plan.kind !== "hold") throw new Error(`an exact demand planned ${plan.kind}`);
          expect(plan.tokens).toBe(promptTokens + per * plan.maxTokens);
          expect(plan.tokens).toBeLessThanOrEqual(available);
          expect(plan.maxTokens).toBeGreaterThanOrEqual(1);
          expect(plan.maxTokens).toBeLessThanOrEqual(maxTokens);
          expect(plan.clamped).toBe(plan.maxTokens < maxTokens);
          // One more token per choice would not fit (or was not asked for).
          if (plan.clamped) expect(plan.tokens + per).toBeGreaterThan(available);
        },
      ),
    );
  });
});

describe("planHold for a streamed capture (its replay held as prompt tokens)", () => {
  it.each([
    // available, [promptTokens, prompts, n, maxTokens], plan: need = P + k·m + n·P + k·(m − 1)
    [1000, [10, 1, 1, 5], { kind: "hold", tokens: 10 + 5 + 10 + 4, maxTokens: 5, clamped: false }],
    [29, [10, 1, 1, 5], { kind: "hold", tokens: 29, maxTokens: 5, clamped: false }],
    [28, [10, 1, 1, 5], { kind: "hold", tokens: 27, maxTokens: 4, clamped: true }],
    [21, [10, 1, 1, 5], { kind: "hold", tokens: 21, maxTokens: 1, clamped: true }],
    [20, [10, 1, 1, 5], { kind: "insufficient", minimumTokens: 21 }],
  ] as const)("available %i, demand %j → %o", (available, [promptTokens, prompts, n, maxTokens], plan) => {
    expect(planHold(available, { promptTokens, prompts, n, maxTokens, captureReplay: true })).toEqual(plan);
  });

  it("holds at most what is available and clamps to the largest max_tokens that fits", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: -1000, max: 200_000 }),
        fc.integer({ min: 0, max: 40_000 }),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 1, max: 16 }),
        fc.integer({ min: 1, max: 32_000 }),
        (available, promptTokens, prompts, n, maxTokens) => {
          const demand = { promptTokens, prompts, n, maxTokens, captureReplay: true };
          const need = (m: number) =>
            promptTokens + prompts * n * m + n * promptTokens + prompts * n * (m - 1);
          const plan = planHold(available, demand);
          if (plan.kind === "insufficient") {
            expect(need(1)).toBeGreaterThan(available);
            expect(plan.minimumTokens).toBe(need(1));
            return;
          }
          if (plan.kind !== "hold") throw new Error(`an exact demand planned ${plan.kind}`);
          expect(plan.tokens).toBe(need(plan.maxTokens));
          expect(plan.tokens).toBeLessThanOrEqual(available);
          expect(plan.clamped).toBe(plan.maxTokens < maxTokens);
          if (plan.clamped) expect(need(plan.maxTokens + 1)).toBeGreaterThan(available);
        },
      ),
    );
  });
});

describe("planHold for a demand with a bound of its prompt tokens", () => {
  it("holds it whole when it fits, else plans nothing (count), never clamping or refusing", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: -1000, max: 40_000 }),
        fc.integer({ min: 0, max: 4096 }),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 1, max: 32 }),
        fc.integer({ min: 1, max: 32_000 }),
        fc.boolean(),
        (available, promptTokens, prompts, n, maxTokens, captureReplay) => {
          const demand = { promptTokens, prompts, n, maxTokens, captureReplay, promptTokensBound: true };
          const plan = planHold(available, demand);
          if (demandTokens(demand) <= available) {
            expect(plan).toEqual({ kind: "hold", tokens: demandTokens(demand), maxTokens, clamped: false });
          } else {
            expect(plan).toEqual({ kind: "count" });
          }
        },
      ),
    );
  });
});
