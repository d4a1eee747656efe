// A non-streamed completion is Inference's stream collected
// (src/service/completions/collect.ts, collectStream): per choice index, text appended, logprobs
// rows and token ids concatenated, the finish and stop reason of the choice's last chunk; choices in
// index order whatever order they came. With keys off too.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema, FinishReason } from "../../gen/acs/v1/completions_pb.js";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import type { VllmClient, VllmCompletionChunk, VllmCompletionRequest } from "../../src/upstream/index.js";
import { serviceOverClient } from "../helpers/service-over-client.js";

type Piece = Partial<VllmCompletionChunk["choices"][number]> & { index: number; text: string };

function chunk(choices: Piece[], usage: VllmCompletionChunk["usage"] = null): VllmCompletionChunk {
  return {
    id: "cmpl-up",
    object: "text_completion",
    created: 1,
    model: "served",
    choices: choices.map((c) => ({
      logprobs: null,
      finish_reason: null,
      stop_reason: null,
      prompt_logprobs: null,
      prompt_token_ids: null,
      token_ids: null,
      ...c,
    })),
    usage,
  } as VllmCompletionChunk;
}

/** The service over a client that streams `chunks` (and has no non-streamed answer). */
function serviceStreaming(chunks: () => VllmCompletionChunk[], ledger: BudgetLedger | undefined) {
  const sent: VllmCompletionRequest[] = [];
  const client = {
    serving: () => true,
    tokenize: async () => ({ count: 2, tokens: [1, 2], maxModelLen: 4096 }),
    async *stream(body: VllmCompletionRequest) {
      sent.push(body);
      yield* chunks();
    },
    async complete(body: VllmCompletionRequest) {
      sent.push(body);
      throw new Error("no non-streamed answer here");
    },
  } as unknown as VllmClient & { serving(): boolean };
  const api = serviceOverClient(client, ledger);
  return { api, sent };
}

const ctx = (authorization?: string) => ({
  requestId: "req_0123456789abcdef0123456789abcdef",
  signal: new AbortController().signal,
  authorization,
  setResponseHeader() {},
});

let dir: string;
let ledger: BudgetLedger;
let bearer: string;
beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-collect-"));
  ledger = await createBudgetLedger({ path: join(dir, "budget.db") });
  bearer = `Bearer ${(await ledger.createKey({ budgetTokens: 1_000_000 })).key}`;
});
afterAll(async () => {
  await ledger.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("collectStream (keys on)", () => {
  const pieces = () => [
    chunk([
      { index: 1, text: "B", token_ids: [21], prompt_token_ids: [1, 2], stop_reason: "ignored" },
      { index: 0, text: "A", token_ids: [11], prompt_token_ids: [1, 2] },
    ]),
    chunk([{ index: 0, text: "a", token_ids: [12, 13], finish_reason: "stop", stop_reason: "\n" }]),
    chunk([{ index: 1, text: "b", token_ids: [22], finish_reason: "length" }]),
    chunk([], { prompt_tokens: 2, completion_tokens: 4, total_tokens: 6 }),
  ];

  it("merges each index's pieces, choices in index order, the last chunk's finish and stop reason", async () => {
    const { api, sent } = serviceStreaming(pieces, ledger);
    const request = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      maxTokens: 4,
      n: 2,
      temperature: 1,
      returnTokenIds: true,
    });
    const r = await api.createCompletion(request, ctx(bearer));
    expect(sent[0]).toMatchObject({
      stream: true,
      return_token_ids: true,
      stream_options: { include_usage: true, continuous_usage_stats: false },
    });
    expect(
      r.choices.map((c) => [c.index, c.text, c.tokenIds, c.promptTokenIds, c.finishReason]),
    ).toStrictEqual([
      [0, "Aa", [11, 12, 13], [1, 2], FinishReason.STOP],
      [1, "Bb", [21, 22], [1, 2], FinishReason.LENGTH],
    ]);
    expect(r.choices[0]?.stopReason).toStrictEqual({ case: "stopString", value: "\n" });
    expect(r.choices[1]?.stopReason).toStrictEqual({ case: undefined });
    expect(r.usage).toMatchObject({ promptTokens: 2, completionTokens: 4, totalTokens: 6 });
    expect(r.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    expect(r.model).toBe("m");
  });

  it("drops token ids when they were not asked for", async () => {
    const { api } = serviceStreaming(pieces, ledger);
    const request = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      maxTokens: 4,
      n: 2,
      temperature: 1,
    });
    const r = await api.createCompletion(request, ctx(bearer));
    for (const c of r.choices) expect([c.tokenIds, c.promptTokenIds]).toStrictEqual([[], []]);
  });
});

describe("keys off", () => {
  it("is Inference's stream collected too: its first event bounds a silent replica's wait", async () => {
    const { api, sent } = serviceStreaming(
      () => [
        chunk([{ index: 0, text: "a", token_ids: [1] }]),
        chunk([{ index: 0, text: "b", finish_reason: "length", token_ids: [2] }]),
      ],
      undefined,
    );
    const request = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "text", value: "x" },
      maxTokens: 4,
    });
    const r = await api.createCompletion(request, ctx());
    expect(sent).toHaveLength(1);
    expect(sent[0]?.stream).toBe(true);
    expect(r.choices.map((c) => [c.text, c.finishReason])).toEqual([["ab", FinishReason.LENGTH]]);
  });
});
