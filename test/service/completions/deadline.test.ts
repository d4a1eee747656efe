// The non-stream deadline (proto/API.md §5) of the completions service over the in-memory
// Inference port and a real SQLite ledger: a non-streamed call — one choice, several choices, a
// lens fan-out — has one deadline timer, started when it runs and cleared when it ends; when
// Inference does not answer, that one timer fires once, every Inference request of the call is
// aborted, the caller gets 504 `deadline_exceeded` with the deadline's message, and the Hold is
// settled once to the charge of §9. Streams have no such deadline (a streamed capture's replay,
// a non-streamed request, has one of its own).
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { Dtype } from "../../../gen/acs/v1/lens_pb.js";
import type { BudgetLedger } from "../../../src/budget/index.js";
import type { MemoryScript } from "../../helpers/memory-inference.js";
import { memoryCtx, memoryLedger, memoryRequest, memoryService } from "../../helpers/memory-service.js";

/** The deadline of these tests, ms: a value no other timer of the service uses. */
const deadlineMs = 157;

let ledger: BudgetLedger;
let close: () => Promise<void>;
beforeAll(async () => {
  ({ ledger, close } = await memoryLedger());
});
afterAll(() => close());
afterEach(() => {
  vi.restoreAllMocks();
});

/** One timer of `deadlineMs` that was set: whether it fired, whether it was cleared. */
interface Timer {
  fired: boolean;
  cleared: boolean;
  readonly handle: ReturnType<typeof setTimeout>;
}

/** Records every timer of `deadlineMs` set from now on (setTimeout and clearTimeout spied on). */
function deadlineTimers(): Timer[] {
  const timers: Timer[] = [];
  const realSet = globalThis.setTimeout;
  const realClear = globalThis.clearTimeout;
  vi.spyOn(globalThis, "setTimeout").mockImplementation(((
    fn: (...args: unknown[]) => void,
    delay?: number,
    ...args: unknown[]
  ) => {
    if (delay !== deadlineMs) return realSet(fn, delay, ...args);
    const handle = realSet(() => {
      timer.fired = true;
      fn(...args);
    }, delay);
    const timer: Timer = { fired: false, cleared: false, handle };
    timers.push(timer);
    return handle;
  }) as typeof setTimeout);
  vi.spyOn(globalThis, "clearTimeout").mockImplementation((handle) => {
    for (const t of timers) if (t.handle === handle && !t.fired) t.cleared = true;
    realClear(handle);
  });
  return timers;
}

/** Timers set and neither fired nor cleared: left behind. */
const left = (timers: readonly Timer[]) => timers.filter((t) => !t.fired && !t.cleared);

/** One steering vector of the memory model (2 layers of hidden size 8): zeros on layer 0. */
const steering = [
  { activations: { dtype: Dtype.FLOAT32, shape: [1, 8], data: new Uint8Array(32) }, layerIndices: [0] },
];

const twoPrompts = { prompt: { case: "texts" as const, value: { values: ["a", "bcd"] } } };

/** A fresh key, a service over `script` with the short deadline, and the timers it sets. */
async function setUp(script: MemoryScript, lensFanOutConcurrency?: number) {
  const created = await ledger.createKey({ budgetTokens: 100_000 });
  const service = memoryService(ledger, script, {
    nonStreamDeadlineMs: deadlineMs,
    ...(lensFanOutConcurrency === undefined ? {} : { lensFanOutConcurrency }),
  });
  const timers = deadlineTimers();
  const { ctx } = memoryCtx(`Bearer ${created.key}`);
  return { service, timers, ctx, spent: async () => (await ledger.usage(created.id)).spentTokens };
}

/** The one Hold of `service`: its tokens and each settle of it. */
function theHold(service: ReturnType<typeof memoryService>) {
  const holds = [...service.taken.holds.values()];
  expect(holds).toHaveLength(1);
  return holds[0] as { tokens: number; settles: number[] };
}

describe("a non-streamed call's one deadline", () => {
  it.each([
    ["one choice", {}, { tokens: 4, hang: { call: 0, chunk: 1 } }],
    ["several choices", { ...twoPrompts, n: 2 }, { tokens: 4, hang: { call: 0, chunk: 2 } }],
    [
      "a lens fan-out of collected streams (one part at a time)",
      { ...twoPrompts, applySteeringVectors: steering },
      { tokens: 2, hang: { call: 1, chunk: 1 } },
    ],
  ] as const)(
    "%s: fires once, aborts Inference, 504, charged what was generated",
    async (_, init, script) => {
      const { service, timers, ctx, spent } = await setUp(script, 1);
      const started = performance.now();
      const err = await service.api.createCompletion(memoryRequest(init), ctx).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(performance.now() - started).toBeGreaterThanOrEqual(deadlineMs - 5);
      expect(err).toMatchObject({
        code: "deadline_exceeded",
        status: 504,
        message: `Inference did not answer within ${deadlineMs} ms.`,
      });
      expect(timers).toHaveLength(1);
      expect(timers[0]?.fired).toBe(true);
      expect(left(timers)).toEqual([]);
      const calls = service.port.calls;
      expect(calls.map((c) => c.end)).toEqual(
        calls.map((_, i) => (i === script.hang.call ? "failed" : "done")),
      );
      // §9: a collected stream cut by the deadline is charged prompt + generated of every request sent.
      const charge = calls.reduce((sum, c) => sum + c.promptTokens + c.generated, 0);
      expect(calls.reduce((sum, c) => sum + c.generated, 0)).toBeGreaterThan(0);
      expect(theHold(service).settles).toEqual([charge]);
      expect(await spent()).toBe(charge);
    },
  );

  it("a lens fan-out of whole answers (captures): fires once; the unanswered part is charged its share of the Hold", async () => {
    const { service, timers, ctx, spent } = await setUp({ tokens: 2, hang: { call: 1, chunk: 0 } }, 1);
    const err = await service.api
      .createCompletion(memoryRequest({ ...twoPrompts, outputResidualStream: { layerIndices: [0] } }), ctx)
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(err).toMatchObject({
      code: "deadline_exceeded",
      message: `Inference did not answer within ${deadlineMs} ms.`,
    });
    expect(timers).toHaveLength(1);
    expect(timers[0]?.fired).toBe(true);
    expect(left(timers)).toEqual([]);
    const [answered, cut] = service.port.calls;
    expect([answered?.kind, answered?.end, cut?.kind, cut?.end]).toEqual([
      "complete",
      "done",
      "complete",
      "failed",
    ]);
    // §9: the answered part its usage; the part cut before it answered its share of the Hold (or
    // what it used, if more); at most the Hold in all.
    const hold = theHold(service);
    const used = (answered?.promptTokens ?? 0) + (answered?.generated ?? 0);
    const charge = Math.min(hold.tokens, used + Math.max(Math.ceil(hold.tokens / 2), cut?.promptTokens ?? 0));
    expect(hold.settles).toEqual([charge]);
    expect(await spent()).toBe(charge);
  });

  it.each([
    ["one choice", {}],
    ["several choices", { ...twoPrompts, n: 2 }],
    ["a lens fan-out", { ...twoPrompts, applySteeringVectors: steering }],
    ["a whole answer (prompt_logprobs)", { promptLogprobs: 0 }],
  ] as const)("%s, answered in time: one timer, cleared when the call ends", async (_, init) => {
    const { service, timers, ctx, spent } = await setUp({ tokens: 2 });
    const r = await service.api.createCompletion(memoryRequest(init), ctx);
    expect(r.choices.length).toBeGreaterThan(0);
    expect(timers).toHaveLength(1);
    expect(timers[0]?.cleared).toBe(true);
    expect(left(timers)).toEqual([]);
    const charge = service.port.calls.reduce((sum, c) => sum + c.promptTokens + c.generated, 0);
    expect(theHold(service).settles).toEqual([charge]);
    expect(await spent()).toBe(charge);
  });
});

describe("a stream", () => {
  it("has no such deadline: it outlives it, and sets no timer", async () => {
    const { service, timers, ctx } = await setUp({ tokens: 3 });
    const chunks: string[] = [];
    for await (const chunk of service.api.streamCompletion(memoryRequest({}), ctx)) {
      chunks.push(chunk.choices.map((c) => c.text).join(""));
      if (chunks.length === 1) await new Promise((r) => setTimeout(r, deadlineMs * 2));
    }
    expect(chunks).toEqual(["t0", "t1", "t2"]);
    expect(timers).toEqual([]);
  });

  it("of a capture bounds its replay (a whole answer) by a deadline of its own, cleared at its end", {
    timeout: 5_000,
  }, async () => {
    const { service, timers, ctx } = await setUp({ tokens: 2, hang: { call: 1, chunk: 0 } });
    const texts: string[] = [];
    const err = await (async () => {
      for await (const chunk of service.api.streamCompletion(
        memoryRequest({ outputResidualStream: { allLayers: true } }),
        ctx,
      )) {
        texts.push(chunk.choices.map((c) => c.text).join(""));
      }
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(texts).toEqual(["t0", "t1"]);
    expect(err).toMatchObject({
      code: "deadline_exceeded",
      message: `Inference did not answer within ${deadlineMs} ms.`,
    });
    expect(service.port.calls.map((c) => [c.kind, c.end])).toEqual([
      ["stream", "done"],
      ["replay", "failed"],
    ]);
    expect(timers).toHaveLength(1);
    expect(left(timers)).toEqual([]);
  });
});
