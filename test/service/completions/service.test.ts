// The completions service on its own, over an in-memory Inference port (test/helpers/memory-inference.ts)
// and a real SQLite ledger: what the port is asked, what the caller gets, what each request is
// charged, and that every Hold, steering lease and admission ticket is given back once.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FinishReason, type StreamCompletionResponse } from "../../../gen/acs/v1/completions_pb.js";
import type { BudgetLedger } from "../../../src/budget/index.js";
import { clampedHeader } from "../../../src/service/index.js";
import { memoryPromptTokens } from "../../helpers/memory-inference.js";
import { memoryCtx, memoryLedger, memoryRequest, memoryService } from "../../helpers/memory-service.js";

let ledger: BudgetLedger;
let close: () => Promise<void>;
beforeAll(async () => {
  ({ ledger, close } = await memoryLedger());
});
afterAll(() => close());

/** A fresh key with `budget` tokens: its bearer and its usage. */
async function key(budget = 100_000) {
  const created = await ledger.createKey({ budgetTokens: budget });
  return { bearer: `Bearer ${created.key}`, usage: () => ledger.usage(created.id) };
}

async function collect(stream: AsyncIterable<StreamCompletionResponse>): Promise<StreamCompletionResponse[]> {
  const chunks: StreamCompletionResponse[] = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

/** Every Hold settled exactly once, every lease and ticket released exactly once. */
function expectAllGivenBack(s: ReturnType<typeof memoryService>): void {
  for (const [, hold] of s.taken.holds) expect(hold.settles).toHaveLength(1);
  expect(s.taken.leases.every((n) => n === 1)).toBe(true);
  expect(s.taken.tickets.every((n) => n === 1)).toBe(true);
  expect(s.steering.inFlight).toBe(0);
}

describe("a unary completion", () => {
  it("is the port's stream collected, charged its usage, with the caller's model and ids", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 3 });
    const { ctx } = memoryCtx(k.bearer);
    const r = await s.api.createCompletion(memoryRequest({}), ctx);
    expect(s.port.calls.map((c) => c.kind)).toEqual(["stream"]);
    expect(s.port.prepared[0]).toMatchObject({ servedModelName: "served", maxTokens: 4, stream: false });
    expect(r.choices.map((c) => [c.text, c.finishReason, c.tokenIds])).toEqual([
      ["t0t1t2", FinishReason.LENGTH, []],
    ]);
    const prompt = memoryPromptTokens("Hi");
    expect(r.usage).toMatchObject({ promptTokens: prompt, completionTokens: 3, totalTokens: prompt + 3 });
    expect(r.model).toBe("m");
    expect(r.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect([...s.taken.holds.values()].map((h) => h.settles)).toEqual([[prompt + 3]]);
    expect((await k.usage()).spentTokens).toBe(prompt + 3);
    expectAllGivenBack(s);
  });

  it("counts its own usage when Inference reports none, and charges that", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 2, usage: false });
    const r = await s.api.createCompletion(memoryRequest({ n: 2 }), memoryCtx(k.bearer).ctx);
    const prompt = memoryPromptTokens("Hi");
    expect(r.usage).toMatchObject({ promptTokens: prompt, completionTokens: 4, totalTokens: prompt + 4 });
    expect((await k.usage()).spentTokens).toBe(prompt + 4);
  });

  it("lowers max_tokens to what the Budget holds, says so in a header, and the port is asked for that", async () => {
    const prompt = memoryPromptTokens("Hi");
    const k = await key(prompt + 2);
    const s = memoryService(ledger, { tokens: 10 });
    const { ctx, headers } = memoryCtx(k.bearer);
    const r = await s.api.createCompletion(memoryRequest({ maxTokens: 10 }), ctx);
    expect(s.port.prepared[0]?.maxTokens).toBe(2);
    expect(headers.get(clampedHeader)).toBeDefined();
    expect(r.usage?.completionTokens).toBe(2);
  });

  it("is refused before the port is asked for a model it does not serve: nothing held, nothing charged", async () => {
    const k = await key();
    const s = memoryService(ledger);
    await expect(
      s.api.createCompletion(memoryRequest({ model: "nope" }), memoryCtx(k.bearer).ctx),
    ).rejects.toMatchObject({
      code: "model_not_found",
      param: "model",
    });
    expect(s.port.calls).toEqual([]);
    expect(s.taken.holds.size).toBe(0);
    expect((await k.usage()).spentTokens).toBe(0);
    expectAllGivenBack(s);
  });

  it("of a capture with two prompts fans out: one whole answer per prompt, activations on each choice, usage summed", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 2 });
    const r = await s.api.createCompletion(
      memoryRequest({
        prompt: { case: "texts", value: { values: ["a", "bcd"] } },
        outputResidualStream: { layerIndices: [1] },
      }),
      memoryCtx(k.bearer).ctx,
    );
    expect(s.port.calls.map((c) => c.kind)).toEqual(["complete", "complete"]);
    expect(r.choices.map((c) => [c.index, c.text, c.activations?.residualStream?.shape])).toEqual([
      [0, "t0t1", [1, memoryPromptTokens("a") + 1, 1]],
      [1, "t0t1", [1, memoryPromptTokens("bcd") + 1, 1]],
    ]);
    const prompts = memoryPromptTokens("a") + memoryPromptTokens("bcd");
    expect(r.usage).toMatchObject({ promptTokens: prompts, completionTokens: 4 });
    expect((await k.usage()).spentTokens).toBe(prompts + 4);
    expectAllGivenBack(s);
  });
});

describe("a streamed completion", () => {
  it("passes each chunk on, then the usage chunk with include_usage; token ids only when asked", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 3 });
    const chunks = await collect(
      s.api.streamCompletion(
        memoryRequest({ streamOptions: { includeUsage: true } }),
        memoryCtx(k.bearer).ctx,
      ),
    );
    expect(chunks.map((c) => c.choices.map((x) => x.text).join(""))).toEqual(["t0", "t1", "t2", ""]);
    expect(
      chunks.slice(0, -1).every((c) => c.usage === undefined && c.choices[0]?.tokenIds.length === 0),
    ).toBe(true);
    const prompt = memoryPromptTokens("Hi");
    expect(chunks.at(-1)?.usage).toMatchObject({ promptTokens: prompt, completionTokens: 3 });
    expect((await k.usage()).spentTokens).toBe(prompt + 3);
    expectAllGivenBack(s);
  });

  it("sends the gateway's count as the usage chunk when Inference sends none", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 2, usage: false });
    const chunks = await collect(
      s.api.streamCompletion(
        memoryRequest({ streamOptions: { includeUsage: true } }),
        memoryCtx(k.bearer).ctx,
      ),
    );
    const prompt = memoryPromptTokens("Hi");
    expect(chunks.at(-1)).toMatchObject({
      choices: [],
      usage: { promptTokens: prompt, completionTokens: 2 },
    });
  });

  it("of a capture replays the prompt and generated tokens for the activations, charged as prompt tokens", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 3 });
    const chunks = await collect(
      s.api.streamCompletion(
        memoryRequest({ outputResidualStream: { allLayers: true } }),
        memoryCtx(k.bearer).ctx,
      ),
    );
    const prompt = memoryPromptTokens("Hi");
    expect(s.port.calls.map((c) => [c.kind, c.promptTokens])).toEqual([
      ["stream", prompt],
      ["replay", prompt + 3 - 1],
    ]);
    expect(s.port.calls.map((c) => c.upstreamRequestId)).toEqual([
      "req_0123456789abcdef0123456789abcdef",
      "req_0123456789abcdef0123456789abcdef-2",
    ]);
    expect(chunks.at(-1)?.activations?.residualStream?.shape).toEqual([1, prompt + 2, 1]);
    expect((await k.usage()).spentTokens).toBe(prompt + 3 + (prompt + 2));
    expectAllGivenBack(s);
  });

  it("stopped by its consumer closes the port's stream and is charged what was generated so far", async () => {
    const k = await key();
    const s = memoryService(ledger, { tokens: 8 });
    const stream = s.api.streamCompletion(memoryRequest({ maxTokens: 8 }), memoryCtx(k.bearer).ctx);
    let read = 0;
    for await (const _ of stream) if (++read === 2) break;
    expect(s.port.calls[0]?.end).toBe("closed");
    expect((await k.usage()).spentTokens).toBe(memoryPromptTokens("Hi") + 2);
    expectAllGivenBack(s);
  });
});

describe("keys off", () => {
  it("serves without a ledger: no Hold, the lease and no ticket", async () => {
    const s = memoryService(undefined, { tokens: 1 });
    const r = await s.api.createCompletion(memoryRequest({}), memoryCtx(undefined).ctx);
    expect(r.choices[0]?.text).toBe("t0");
    expect(s.taken.holds.size).toBe(0);
    expect(s.taken.tickets).toEqual([]);
    expectAllGivenBack(s);
  });

  it("lists the served model with its facts", async () => {
    const s = memoryService(undefined);
    const list = await s.api.listModels(memoryCtx(undefined).ctx);
    expect(list.data.map((m) => [m.id, m.maxModelLen, m.hiddenSize, m.numHiddenLayers])).toEqual([
      ["m", 4096, 8, 2],
    ]);
  });
});
