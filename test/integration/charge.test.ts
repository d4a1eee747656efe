// One rule of charging, whatever the request kind: prompt + tokens generated — Inference's usage
// where it reports one, else the prompt as the Hold counted it plus the token ids streamed — and a
// streamed capture's replay as prompt tokens. Real gateway, real SQLite ledger.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { chunk, type FakeUpstream, sse, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

let dir: string;
let upstream: FakeUpstream;
let scripted: Stack;
let engine: Stack;

/** Prompt tokens the scripted /tokenize gives every prompt. */
const PROMPT_TOKENS = 2;
const GENERATED = 5;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-charge-"));
  upstream = await startFakeUpstream(
    withVllmOps((req, res, body) => {
      if (req.url === "/tokenize") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ count: PROMPT_TOKENS, max_model_len: 512, tokens: [1, 2] }));
        return;
      }
      const json = JSON.parse(body) as { prompt: string };
      // The prompt picks whether Inference reports usage: "usage" sends total_tokens 40.
      const withUsage = json.prompt === "usage";
      const chunks: unknown[] = Array.from({ length: GENERATED }, (_, i) =>
        chunk(0, `t${i}`, i === GENERATED - 1 ? "length" : null, { token_ids: [10 + i] }),
      );
      if (withUsage) {
        chunks.push({
          ...chunk(0, ""),
          choices: [],
          usage: { prompt_tokens: PROMPT_TOKENS, completion_tokens: GENERATED, total_tokens: 40 },
        });
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(sse(chunks));
    }),
  );
  scripted = await startStack({ upstreamUrl: upstream.url, dbPath: join(dir, "scripted.db") });
  engine = await startStack({ dbPath: join(dir, "engine.db") });
});
afterAll(async () => {
  await scripted?.close();
  await engine?.close();
  await upstream?.close();
  rmSync(dir, { recursive: true, force: true });
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

async function post(stack: Stack, key: string, body: Record<string, unknown>) {
  return checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: stack.alias, ...body }),
  });
}

describe("charging without usage from Inference", () => {
  it.each([false, true])("stream %s: prompt + the tokens generated", async (stream) => {
    const ledger = scripted.ledger!;
    const { id, key } = await ledger.createKey({ budgetTokens: 1000 });
    const res = await post(scripted, key, { prompt: "no usage", max_tokens: 8, stream });
    expect(res.status).toBe(200);
    await res.text();
    const usage = await ledger.usage(id);
    expect(usage.spentTokens).toBe(PROMPT_TOKENS + GENERATED);
    expect(usage.openHolds).toBe(0);
  });

  // Inference streams tokens and [DONE] without a usage object: the response's usage is the
  // gateway's own count, equal to the charge (issue 32), streamed (include_usage) or not.
  it.each([false, true])("stream %s: the usage is the gateway's count, what was charged", async (stream) => {
    const ledger = scripted.ledger!;
    const { id, key } = await ledger.createKey({ budgetTokens: 1000 });
    const res = await post(scripted, key, {
      prompt: "no usage",
      max_tokens: 8,
      stream,
      ...(stream ? { stream_options: { include_usage: true } } : {}),
    });
    expect(res.status).toBe(200);
    const text = await res.text();
    type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
    const usage = stream
      ? sseChunks<{ choices: unknown[]; usage: Usage }>(text).at(-1)
      : (JSON.parse(text) as { usage: Usage });
    if (stream) expect(usage).toMatchObject({ choices: [] });
    expect(usage?.usage).toMatchObject({
      prompt_tokens: PROMPT_TOKENS,
      completion_tokens: GENERATED,
      total_tokens: PROMPT_TOKENS + GENERATED,
    });
    expect((await ledger.usage(id)).spentTokens).toBe(usage?.usage?.total_tokens);
  });

  it.each([false, true])("stream %s: Inference's usage when it reports one", async (stream) => {
    const ledger = scripted.ledger!;
    const { id, key } = await ledger.createKey({ budgetTokens: 1000 });
    const res = await post(scripted, key, { prompt: "usage", max_tokens: 50, stream });
    expect(res.status).toBe(200);
    await res.text();
    expect((await ledger.usage(id)).spentTokens).toBe(40);
  });
});

describe("a streamed capture", () => {
  it("is charged its replay prefill (prompt + generated − 1) as prompt tokens, within its Hold", async () => {
    const ledger = engine.ledger!;
    // The Hold: "Hi" is 3 tokens, + 4 generated, + the replay of 3 + 4 − 1 = 13 tokens; a Budget of
    // exactly that is not clamped, and the charge must fit it.
    const hold = 3 + 4 + (3 + 4 - 1);
    const { id, key } = await ledger.createKey({ budgetTokens: hold });
    const res = await post(engine, key, {
      prompt: "Hi",
      max_tokens: 4,
      temperature: 0,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
      output_residual_stream: [0],
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-acs-max-tokens-clamped")).toBeNull();
    const chunks = sseChunks(await res.text()) as Array<{
      usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
      activations?: unknown;
    }>;
    const usage = chunks.find((c) => c.usage)?.usage;
    expect(usage).toMatchObject({ prompt_tokens: 3, completion_tokens: 4 });
    expect(chunks.at(-1)?.activations).toBeDefined();
    const replay = usage!.prompt_tokens + usage!.completion_tokens - 1;
    expect((await ledger.usage(id)).spentTokens).toBe(usage!.total_tokens + replay);
    expect((await ledger.usage(id)).spentTokens).toBeLessThanOrEqual(hold);
    expect((await ledger.usage(id)).openHolds).toBe(0);
  });

  it("holds the replay too: a Budget that fits the text but not the replay is clamped", async () => {
    const ledger = engine.ledger!;
    // "Hi" is 3 tokens: 4 tokens of text need 3 + 4 = 7; with the replay 7 + 3 + 3 = 13.
    const { id, key } = await ledger.createKey({ budgetTokens: 12 });
    const res = await post(engine, key, {
      prompt: "Hi",
      max_tokens: 4,
      temperature: 0,
      ignore_eos: true,
      stream: true,
      output_residual_stream: [0],
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-acs-max-tokens-clamped")).toBe("3");
    await res.text();
    // 3 prompt + 3 generated + replay of 3 + 3 − 1.
    expect((await ledger.usage(id)).spentTokens).toBe(11);
  });
});
