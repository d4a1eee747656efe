// Keys off, a byte-level tokenizer, several prompts × n > 1 (and echo): Inference's stream,
// collected, its choices ordered as vLLM orders them (index = prompt × n + k), makes each prompt's
// bound exact from its choice's prompt token ids — the access line counts each prompt once,
// exactly — and a prompt longer than its bound at a choice index > 0 marks the tokenizer as not
// byte-level (test/integration/prompt-bound.test.ts has one prompt, streamed and not).
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { wordTokenize } from "../helpers/word-tokenizer.js";
import {
  answerCompletion,
  chunk,
  type FakeUpstream,
  startFakeUpstream,
  withVllmOps,
} from "../upstream/fake-upstream.js";

let upstream: FakeUpstream;
let open: Stack;
const log: Array<Record<string, unknown>> = [];

beforeAll(async () => {
  upstream = await startFakeUpstream(
    withVllmOps((req, res, body) => {
      const json = JSON.parse(body) as {
        prompt: string | string[];
        n?: number;
        echo?: boolean;
        add_special_tokens?: boolean;
        max_tokens: number;
        stream?: boolean;
      };
      const prompts = typeof json.prompt === "string" ? [json.prompt] : json.prompt;
      const ids = prompts.map((p) => wordTokenize(p, json.add_special_tokens ?? true));
      if (req.url === "/tokenize") {
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ count: ids[0]!.length, max_model_len: 512, tokens: ids[0] }));
        return;
      }
      const n = json.n ?? 1;
      const generated = Math.min(json.max_tokens, 2);
      const token_ids = Array.from({ length: generated }, (_, i) => 10 + i);
      // vLLM: index = len(choices), prompt-major
      const events: unknown[] = ids.flatMap((prompt_token_ids, p) =>
        Array.from({ length: n }, (_, k) => {
          const text = `${json.echo === true ? prompts[p] : ""}${"xy".slice(0, generated)}`;
          return chunk(p * n + k, text, "length", { token_ids, prompt_token_ids });
        }),
      );
      const promptTokens = ids.reduce((a, b) => a + b.length, 0);
      const completion = prompts.length * n * generated;
      events.push({
        ...chunk(0, ""),
        choices: [],
        usage: {
          prompt_tokens: promptTokens,
          completion_tokens: completion,
          total_tokens: promptTokens + completion,
        },
      });
      answerCompletion(res, body, events);
    }),
  );
  open = await startStack({
    upstreamUrl: upstream.url,
    model: { byteLevelTokenizer: true },
    logger: pino(
      { level: "info" },
      new Writable({
        write(line: Buffer, _e, done) {
          log.push(JSON.parse(line.toString()) as Record<string, unknown>);
          done();
        },
      }),
    ),
  });
});
afterAll(async () => {
  await open?.close();
  await upstream?.close();
});

async function request(body: Record<string, unknown>) {
  const from = upstream.requests.length;
  const res = await fetch(`${open.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: open.alias, max_tokens: 2, ...body }),
  });
  const text = await res.text();
  expect(res.status, text).toBe(200);
  const id = res.headers.get("x-request-id");
  const isLine = (l: Record<string, unknown>) => l.requestId === id && l.msg === "request";
  await until(() => log.some(isLine), "access line");
  return {
    usage: (JSON.parse(text) as { usage: { prompt_tokens: number } }).usage,
    line: log.find(isLine) ?? {},
    tokenized: upstream.requests
      .slice(from)
      .filter((r) => r.url === "/tokenize" && (JSON.parse(r.body) as { prompt: string }).prompt !== "")
      .length,
  };
}

describe("keys off, several prompts × n, unary", () => {
  it.each([
    [1, false],
    [2, false],
    [3, false],
    [2, true],
  ])("n %i echo %s: the access line counts each prompt once, exactly", async (n, echo) => {
    // exact: 7 + 3 = 10; bounds: (11+1) + (3+1) = 16; noted only from choice 0: 7 + 4 = 11
    const r = await request({ prompt: ["a b c d e f", "x y"], n, echo });
    expect(r.tokenized).toBe(0);
    expect(r.usage.prompt_tokens).toBe(10);
    expect(r.line.promptTokens).toBe(10);
  });

  it("a prompt longer than its bound at a later choice index: counted by /tokenize from then on", async () => {
    const r = await request({ prompt: ["fine", "many tokens"], n: 2 }); // 2 + 33
    expect(r.line.promptTokens).toBe(35);
    const after = await request({ prompt: "fine after" });
    expect(after.tokenized).toBe(1);
  });
});
