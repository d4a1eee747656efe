// streamCompletion's loop over Inference's stream is `for await` written out (so no chunk is held
// between two): it must close the upstream iterator as `for await` does — on the consumer's
// return() or throw() at a yield, on an error of its own, also when the close fails — but not when
// the iterator itself threw or ended; and the Hold is settled exactly once on every one of these.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { type BudgetLedger, createBudgetLedger } from "../../src/budget/index.js";
import type { VllmClient, VllmCompletionChunk } from "../../src/upstream/index.js";
import { serviceOverClient } from "../helpers/service-over-client.js";

const piece = (i: number): VllmCompletionChunk =>
  ({
    id: "cmpl-up",
    object: "text_completion",
    created: 1,
    model: "served",
    choices: [
      {
        index: 0,
        text: `t${i}`,
        logprobs: null,
        finish_reason: null,
        stop_reason: null,
        prompt_logprobs: null,
        prompt_token_ids: i === 0 ? [1, 2] : null,
        token_ids: [10 + i],
      },
    ],
    usage: null,
  }) as VllmCompletionChunk;

interface Log {
  next: number;
  ret: number;
}
function service(ledger: BudgetLedger, behave: { failAt?: number; returnRejects?: boolean }) {
  const log: Log = { next: 0, ret: 0 };
  const client = {
    serving: () => true,
    tokenize: async () => ({ count: 2, tokens: [1, 2], maxModelLen: 4096 }),
    stream() {
      let i = 0;
      const it: AsyncIterableIterator<VllmCompletionChunk> = {
        [Symbol.asyncIterator]() {
          return it;
        },
        async next() {
          log.next++;
          if (behave.failAt === i) throw new Error("upstream broke");
          if (i >= 5) return { value: undefined, done: true };
          return { value: piece(i++), done: false };
        },
        async return() {
          log.ret++;
          if (behave.returnRejects) throw new Error("return failed");
          return { value: undefined, done: true };
        },
      };
      return it;
    },
    async complete() {
      throw new Error("no");
    },
  } as unknown as VllmClient & { serving(): boolean };
  const api = serviceOverClient(client, ledger);
  return { api, log };
}

let dir: string;
let ledger: BudgetLedger;
beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-close-rules-"));
  ledger = await createBudgetLedger({ path: join(dir, "budget.db") });
});
afterAll(async () => {
  await ledger.close();
  rmSync(dir, { recursive: true, force: true });
});

const req = create(CreateCompletionRequestSchema, {
  model: "m",
  prompt: { case: "text", value: "x" },
  maxTokens: 8,
});
async function run(
  behave: Parameters<typeof service>[1],
  drive: (it: AsyncGenerator<unknown>) => Promise<unknown>,
) {
  const { id, key } = await ledger.createKey({ budgetTokens: 100_000 });
  const { api, log } = service(ledger, behave);
  const it = api.streamCompletion(req, {
    requestId: "req_0123456789abcdef0123456789abcdef",
    signal: new AbortController().signal,
    authorization: `Bearer ${key}`,
    setResponseHeader() {},
  }) as AsyncGenerator<unknown>;
  const outcome = await drive(it).then(
    (v) => ({ ok: v }),
    (e: unknown) => ({ err: String(e) }),
  );
  const u = await ledger.usage(id);
  return { log, outcome, open: u.openHolds, settled: u.settledHolds, spent: u.spentTokens };
}

it("return() at a yield", async () => {
  const r = await run({}, async (it) => {
    await it.next();
    await it.next();
    return it.return(undefined);
  });
  expect(r).toMatchObject({ log: { ret: 1 }, open: 0, settled: 1, spent: 4 });
});
it("throw() at a yield", async () => {
  const r = await run({}, async (it) => {
    await it.next();
    return it.throw(new Error("consumer"));
  });
  expect(r).toMatchObject({ log: { ret: 1 }, open: 0, settled: 1 });
  expect(r.outcome).toHaveProperty("err");
});
it("upstream throws: not closed", async () => {
  const r = await run({ failAt: 2 }, async (it) => {
    for (;;) {
      const n = await it.next();
      if (n.done) return;
    }
  });
  expect(r).toMatchObject({ log: { ret: 0 }, open: 0, settled: 1 });
  expect(r.outcome).toHaveProperty("err");
});
it("to the end: not closed", async () => {
  const r = await run({}, async (it) => {
    let k = 0;
    for (;;) {
      const n = await it.next();
      if (n.done) return k;
      k++;
    }
  });
  expect(r).toMatchObject({ log: { ret: 0, next: 6 }, open: 0, settled: 1, outcome: { ok: 5 } });
});
it("return() rejects at a consumer's return", async () => {
  const r = await run({ returnRejects: true }, async (it) => {
    await it.next();
    return it.return(undefined);
  });
  expect(r).toMatchObject({ log: { ret: 1 }, open: 0, settled: 1 });
});
it("return() before the first next", async () => {
  const r = await run({}, async (it) => it.return(undefined));
  expect(r).toMatchObject({ log: { ret: 0, next: 0 }, open: 0, settled: 0 });
});
