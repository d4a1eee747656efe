// One end path, whatever way a call ends: a property over unary and streamed calls (one choice,
// several choices, a lens fan-out) failed at every step of the check order and at every point of
// Inference's streams — a refusal, a call that fails mid-stream, a caller who goes away, a consumer
// that stops reading. Each time the steering lease and the admission ticket are released exactly
// once, the Hold is settled exactly once, no stream of the port is left open, and the charge is
// the rule of proto/API.md §9 computed from what the in-memory port delivered (not from the meter):
// nothing when the call never reached Inference or Inference did no work; otherwise prompt +
// generated of every upstream request sent, plus a streamed capture's replay prompt.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import type { BudgetLedger } from "../../../src/budget/index.js";
import { ApiError, toApiError } from "../../../src/core/errors/index.js";
import { type CheckStep, checkOrder } from "../../../src/service/completions/check-order.js";
import type { MemoryCall, MemoryScript } from "../../helpers/memory-inference.js";
import { memoryCtx, memoryLedger, memoryService } from "../../helpers/memory-service.js";

let ledger: BudgetLedger;
let close: () => Promise<void>;
beforeAll(async () => {
  ({ ledger, close } = await memoryLedger());
});
afterAll(() => close());

type Shape = "one" | "choices" | "fan_out";
type Fault =
  | { kind: "none" }
  | { kind: "step"; step: number }
  | { kind: "throw"; call: number; chunk: number; code: "upstream_error" | "upstream_unavailable" }
  | { kind: "abort"; call: number; chunk: number }
  | { kind: "stop"; after: number };

interface Scenario {
  stream: boolean;
  shape: Shape;
  includeUsage: boolean;
  usage: boolean;
  tokens: number;
  fault: Fault;
}

const shapes: Record<Shape, MessageInitShape<typeof CreateCompletionRequestSchema>> = {
  one: { prompt: { case: "text", value: "Hi" } },
  choices: { prompt: { case: "texts", value: { values: ["a", "bcd"] } }, n: 2 },
  fan_out: {
    prompt: { case: "texts", value: { values: ["a", "bcd"] } },
    outputResidualStream: { layerIndices: [0] },
  },
};

const scenario: fc.Arbitrary<Scenario> = fc.record({
  stream: fc.boolean(),
  shape: fc.constantFrom<Shape>("one", "choices", "fan_out"),
  includeUsage: fc.boolean(),
  usage: fc.boolean(),
  tokens: fc.integer({ min: 1, max: 4 }),
  fault: fc.oneof(
    fc.constant<Fault>({ kind: "none" }),
    fc.record({
      kind: fc.constant("step" as const),
      step: fc.integer({ min: 0, max: checkOrder.length - 1 }),
    }),
    fc.record({
      kind: fc.constant("throw" as const),
      call: fc.integer({ min: 0, max: 3 }),
      chunk: fc.integer({ min: 0, max: 10 }),
      code: fc.constantFrom("upstream_error" as const, "upstream_unavailable" as const),
    }),
    fc.record({
      kind: fc.constant("abort" as const),
      call: fc.integer({ min: 0, max: 1 }),
      chunk: fc.integer({ min: 1, max: 10 }),
    }),
    fc.record({ kind: fc.constant("stop" as const), after: fc.integer({ min: 1, max: 12 }) }),
  ),
});

/** The check order with step `k` failing once it has run (what it took stays taken). */
function failingAt(k: number): CheckStep[] {
  return checkOrder.map((step, i) =>
    i !== k
      ? step
      : {
          name: step.name,
          run: async (draft, env) => {
            await step.run(draft, env);
            throw new ApiError("invalid_request", `injected after step ${step.name}`);
          },
        },
  );
}

/** The errors after which Inference did no work (src/service/usage-meter.ts names them too). */
const noWork = new Set([
  "upstream_unavailable",
  "invalid_request",
  "context_length_exceeded",
  "model_not_found",
]);

/** The charge of proto/API.md §9, from what the port delivered. */
function expectedCharge(calls: readonly MemoryCall[], failure: unknown): number {
  if (calls.length === 0) return 0;
  const generated = calls.filter((c) => c.kind !== "replay").reduce((a, c) => a + c.generated, 0);
  if (failure !== undefined && noWork.has(toApiError(failure).code) && generated === 0) return 0;
  let charge = 0;
  for (const c of calls) {
    if (c.kind === "replay") charge += c.end === "done" ? c.promptTokens : 0;
    else charge += c.promptTokens + c.generated;
  }
  return charge;
}

/** Runs one scenario; what the caller saw fail, if anything. */
async function run(
  s: Scenario,
  service: ReturnType<typeof memoryService>,
  ctx: ReturnType<typeof memoryCtx>["ctx"],
) {
  const init: MessageInitShape<typeof CreateCompletionRequestSchema> = {
    model: "m",
    maxTokens: 4,
    ...shapes[s.shape],
  };
  if (s.stream && s.includeUsage) init.streamOptions = { includeUsage: true };
  const request = create(CreateCompletionRequestSchema, init);
  try {
    if (!s.stream) {
      await service.api.createCompletion(request, ctx);
      return undefined;
    }
    let read = 0;
    for await (const _ of service.api.streamCompletion(request, ctx)) {
      if (s.fault.kind === "stop" && ++read === s.fault.after) break;
    }
    return undefined;
  } catch (err) {
    return err;
  }
}

describe("every call ends once", () => {
  it("lease, ticket and Hold given back exactly once; charged by the rule; no stream left open", async () => {
    await fc.assert(
      fc.asyncProperty(scenario, async (s) => {
        // A non-streamed capture's whole answer cut by its caller is charged its Hold (its tokens
        // are unknown): test/service/usage-meter.test.ts holds that rule; here calls are streams.
        fc.pre(!(s.fault.kind === "abort" && !s.stream && s.shape === "fan_out"));
        const created = await ledger.createKey({ budgetTokens: 1_000_000 });
        const { ctx, controller } = memoryCtx(`Bearer ${created.key}`);
        const fault = s.fault;
        const script: MemoryScript = { tokens: s.tokens, usage: s.usage };
        if (fault.kind === "throw") {
          script.fail = { call: fault.call, chunk: fault.chunk, error: new ApiError(fault.code, "injected") };
        }
        if (fault.kind === "abort") {
          script.onChunk = (call, chunks) => {
            if (call === fault.call && chunks === fault.chunk) controller.abort();
          };
        }
        const service = memoryService(
          ledger,
          script,
          fault.kind === "step" ? { checkOrder: failingAt(fault.step) } : {},
        );
        const failure = await run(s, service, ctx);

        const { taken, port } = service;
        expect(taken.leases).toEqual([1]);
        expect(taken.tickets.every((n) => n === 1)).toBe(true);
        expect(service.steering.inFlight).toBe(0);
        expect(service.admission.inFlight(created.id).requests).toBe(0);
        expect(port.calls.filter((c) => c.end === "open")).toEqual([]);
        const holds = [...taken.holds.values()];
        expect(holds.length).toBeLessThanOrEqual(1);
        for (const hold of holds) expect(hold.settles).toHaveLength(1);
        const charged = holds[0]?.settles[0] ?? 0;
        expect(charged).toBe(expectedCharge(port.calls, failure));
        const usage = await ledger.usage(created.id);
        expect([usage.spentTokens, usage.heldTokens, usage.openHolds]).toEqual([charged, 0, 0]);
        if (fault.kind === "none") expect(failure).toBeUndefined();
      }),
      { numRuns: 300 },
    );
  });
});
