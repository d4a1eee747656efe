// The one rule of charging a request: prompt + tokens generated (Inference's usage where reported).
import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/core/errors/index.js";
import { UsageMeter } from "../../src/service/usage-meter.js";

const err = (code: ConstructorParameters<typeof ApiError>[0]) => new ApiError(code, "x");

describe("UsageMeter", () => {
  it("charges prompt + generated when Inference reports no usage, and its usage when it does", () => {
    const meter = new UsageMeter(2);
    meter.addGenerated(3);
    meter.addGenerated(2);
    expect(meter.charge(undefined, 100)).toBe(7);
    meter.report(9);
    expect(meter.charge(undefined, 100)).toBe(9);
  });

  it("adds a streamed capture's replay as prompt tokens", () => {
    const meter = new UsageMeter(4);
    meter.addGenerated(5);
    meter.addReplay(8);
    expect(meter.used).toBe(17);
  });

  it("charges nothing when Inference did no work, and what was generated when it did", () => {
    for (const code of ["upstream_unavailable", "invalid_request", "context_length_exceeded"] as const) {
      const meter = new UsageMeter(4);
      expect(meter.charge(err(code), 50)).toBe(0);
      meter.addGenerated(1);
      expect(meter.charge(err(code), 50)).toBe(5);
    }
    const broken = new UsageMeter(4);
    broken.addGenerated(3);
    expect(broken.charge(err("upstream_error"), 50)).toBe(7);
    expect(broken.charge(new Error("bug"), 50)).toBe(7);
  });

  it("charges the whole Hold when a non-streamed Inference call was cut short before it answered", () => {
    const counted = new UsageMeter(4);
    expect(counted.charge(err("canceled"), 50)).toBe(4);
    const uncounted = new UsageMeter(4);
    uncounted.markUncounted();
    expect(uncounted.charge(err("canceled"), 50)).toBe(50);
    expect(uncounted.charge(err("deadline_exceeded"), 50)).toBe(50);
    expect(uncounted.charge(err("upstream_error"), 50)).toBe(4);
    uncounted.report(12); // Inference answered after all
    expect(uncounted.charge(err("canceled"), 50)).toBe(12);
  });

  it("with bounds of the prompts: exact counts from Inference's prompt token ids, per prompt (index = prompt × n + k)", () => {
    const meter = new UsageMeter(0, { perPrompt: [10, 20], n: 2 });
    expect(meter.promptTokens).toBe(30);
    expect(meter.promptCounted).toBe(false);
    expect(meter.chargeNeedsPromptCount(err("canceled"))).toBe(true);
    expect(meter.chargeNeedsPromptCount(err("upstream_unavailable"))).toBe(false); // charged 0 anyway
    meter.notePromptTokens(3, 7); // choice 3 = prompt 1
    expect(meter.promptTokens).toBe(17);
    meter.notePromptTokens(2, 99); // prompt 1 is known: ignored
    expect(meter.promptTokens).toBe(17);
    expect(meter.boundBroken).toBe(false);
    meter.notePromptTokens(1, 4); // choice 1 = prompt 0
    expect(meter.promptCounted).toBe(true);
    expect(meter.chargeNeedsPromptCount(err("canceled"))).toBe(false);
    meter.addGenerated(2);
    expect(meter.charge(err("canceled"), 100)).toBe(4 + 7 + 2);
  });

  it("with bounds: an exact count fills the prompts still unknown; a prompt above its bound is noticed", () => {
    const meter = new UsageMeter(0, { perPrompt: [10, 20], n: 1 });
    meter.notePromptTokens(0, 3);
    meter.setPromptTokens([5, 6]); // prompt 0 stays as Inference told it
    expect(meter.promptTokens).toBe(3 + 6);
    expect(meter.promptCounted).toBe(true);
    const reported = new UsageMeter(0, { perPrompt: [10], n: 1 });
    reported.report(15);
    expect(reported.chargeNeedsPromptCount(undefined)).toBe(false);
    const broken = new UsageMeter(0, { perPrompt: [10], n: 1 });
    broken.notePromptTokens(0, 11);
    expect(broken.boundBroken).toBe(true);
  });

  it("sums the parts of a fan-out: each part's usage where reported, else its prompt + generated", () => {
    const meter = new UsageMeter([3, 4, 5]);
    expect(meter.promptTokens).toBe(12);
    meter.addGenerated(2, 0);
    meter.addGenerated(1, 2);
    meter.report(20, 1);
    meter.addReplay(6, 2);
    // part 0: 3 + 2; part 1: its usage 20; part 2: 5 + 1 + replay 6
    expect(meter.used).toBe(37);
    expect(meter.generated).toBe(3);
    expect(() => meter.addGenerated(1, 3)).toThrow(RangeError);
  });

  it("in a fan-out, charges nothing for parts never sent, and a part cut short unanswered its share of the Hold", () => {
    const idle = new UsageMeter([3, 4]);
    expect(idle.charge(err("upstream_unavailable"), 50)).toBe(0);
    idle.report(9, 0);
    expect(idle.charge(err("upstream_unavailable"), 50)).toBe(9); // part 1 was never sent
    idle.markStarted(1);
    expect(idle.charge(err("upstream_unavailable"), 50)).toBe(13); // sent: its prompt was read
    const unary = new UsageMeter([3, 4, 5, 6]);
    unary.markUncounted(0);
    unary.markUncounted(1);
    unary.report(9, 0);
    // part 1 sent and unanswered: its share, 100 / 4 = 25; parts 2 and 3 never sent: nothing.
    expect(unary.charge(err("canceled"), 100)).toBe(9 + 25);
    expect(unary.charge(err("deadline_exceeded"), 100)).toBe(9 + 25);
    unary.report(6, 1);
    expect(unary.charge(err("canceled"), 100)).toBe(15);
    // At most the Hold, however many parts are cut short.
    const all = new UsageMeter([3, 4]);
    all.markUncounted(0);
    all.markUncounted(1);
    expect(all.charge(err("canceled"), 7)).toBe(7);
  });
});

describe("UsageMeter.restart (a unary call failed over after chunks)", () => {
  it("charges the answer the caller got, not the failed replica's tokens", () => {
    const m = new UsageMeter(10);
    m.addGenerated(5);
    m.report(15);
    m.restart();
    m.addGenerated(3);
    expect(m.used).toBe(13);
    expect(m.charge(undefined, 100)).toBe(13);
  });
});
