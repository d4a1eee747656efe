// A text prompt is checked against max_model_len and held on its Budget with a bound of its tokens
// (UTF-8 bytes + the special tokens added) when the model's tokenizer is byte-level: no /tokenize
// round trip when the bound decides, an exact count when it cannot (near max_model_len, the default
// max_tokens, a clamp or refusal near the end of a Budget, a capture, prompt_logprobs, a stream cut
// short before Inference told its prompt). Two real gateways on one recording scripted Inference —
// one with byte_level_tokenizer, one without — give the same answers and settle the same Budgets.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { until } from "../helpers/hang-guard.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { wordTokenize } from "../helpers/word-tokenizer.js";
import { chunk, type FakeUpstream, sse, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

const MAX_MODEL_LEN = 512;

let dir: string;
let upstream: FakeUpstream;
let bound: Stack;
let exact: Stack;
/** Keys off, byte-level tokenizer: unary requests are Inference's stream, collected. */
let open: Stack;
/** The access log lines of `open`. */
const openLog: Array<Record<string, unknown>> = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-bound-"));
  upstream = await startFakeUpstream(
    withVllmOps(
      (req, res, body) => {
        const json = JSON.parse(body) as {
          prompt: string;
          add_special_tokens?: boolean;
          max_tokens: number;
          stream?: boolean;
        };
        const promptIds = wordTokenize(json.prompt, json.add_special_tokens ?? true);
        res.setHeader("content-type", "application/json");
        if (req.url === "/tokenize") {
          res.end(
            JSON.stringify({ count: promptIds.length, max_model_len: MAX_MODEL_LEN, tokens: promptIds }),
          );
          return;
        }
        if (json.prompt.startsWith("hang")) {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.write(": waiting\n\n"); // never answers: the caller goes away
          return;
        }
        const generated = Math.min(json.max_tokens, 3);
        const usage = {
          prompt_tokens: promptIds.length,
          completion_tokens: generated,
          total_tokens: promptIds.length + generated,
        };
        if (json.stream !== true) {
          const choice = {
            index: 0,
            text: "abc".slice(0, generated),
            logprobs: null,
            finish_reason: "length",
            stop_reason: null,
            prompt_logprobs: [
              null,
              ...promptIds.slice(1).map((id) => ({ [id]: { logprob: -1, rank: 1, decoded_token: "w" } })),
            ],
            token_ids: Array.from({ length: generated }, (_, i) => 10 + i),
            prompt_token_ids: promptIds,
          };
          res.end(
            JSON.stringify({
              id: "cmpl-x",
              object: "text_completion",
              created: 1,
              model: "acs/fake",
              choices: [choice],
              usage,
            }),
          );
          return;
        }
        const chunks: unknown[] = Array.from({ length: generated }, (_, i) =>
          chunk(0, "abc"[i]!, i === generated - 1 ? "length" : null, {
            token_ids: [10 + i],
            ...(i === 0 ? { prompt_token_ids: promptIds } : {}),
          }),
        );
        chunks.push({ ...chunk(0, ""), choices: [], usage });
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.end(sse(chunks));
      },
      "acs/fake",
      MAX_MODEL_LEN,
    ),
  );
  bound = await startStack({
    upstreamUrl: upstream.url,
    dbPath: join(dir, "bound.db"),
    model: { byteLevelTokenizer: true },
  });
  exact = await startStack({ upstreamUrl: upstream.url, dbPath: join(dir, "exact.db") });
  const lines = new Writable({
    write(line: Buffer, _encoding, done) {
      openLog.push(JSON.parse(line.toString()) as Record<string, unknown>);
      done();
    },
  });
  open = await startStack({
    upstreamUrl: upstream.url,
    model: { byteLevelTokenizer: true },
    logger: pino({ level: "info" }, lines),
  });
});
afterAll(async () => {
  await bound?.close();
  await exact?.close();
  await open?.close();
  await upstream?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The prompts Inference was asked to /tokenize since request `from`. */
const tokenized = (from: number) =>
  upstream.requests
    .slice(from)
    .filter((r) => r.url === "/tokenize")
    .map((r) => (JSON.parse(r.body) as { prompt: string }).prompt);

interface Outcome {
  status: number;
  clamped: string | null;
  /** The body without what differs per call (ids, created, request ids). */
  body: unknown;
  spent: number;
  /** Prompts /tokenize was asked for during the call. */
  tokenized: string[];
}

/** One request on `stack` with a fresh key of `budget` tokens; its Hold settled before it returns. */
async function call(stack: Stack, body: Record<string, unknown>, budget = 100_000): Promise<Outcome> {
  const ledger = stack.ledger!;
  const { id, key } = await ledger.createKey({ budgetTokens: budget });
  const from = upstream.requests.length;
  const res = await fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: stack.alias, ...body }),
  });
  const text = await res.text();
  const parsed: unknown = body.stream === true ? text : JSON.parse(text);
  await until(async () => (await ledger.usage(id)).openHolds === 0, "the Hold is settled");
  return {
    status: res.status,
    clamped: res.headers.get("x-acs-max-tokens-clamped"),
    body: strip(parsed),
    spent: (await ledger.usage(id)).spentTokens,
    tokenized: tokenized(from),
  };
}

function strip(value: unknown): unknown {
  if (typeof value === "string") return value.replace(/"(id|created)":("[^"]*"|\d+),?/g, "");
  if (value === null || typeof value !== "object") return value;
  const { id: _, created: __, request_id: ___, ...rest } = value as Record<string, unknown>;
  return Object.fromEntries(Object.entries(rest).map(([k, v]) => [k, strip(v)]));
}

/** The same request on both gateways: the outcomes (less the /tokenize calls) must be equal. */
async function both(body: Record<string, unknown>, budget?: number) {
  const b = await call(bound, body, budget);
  const e = await call(exact, body, budget);
  const { tokenized: bt, ...bRest } = b;
  const { tokenized: et, ...eRest } = e;
  expect(bRest).toEqual(eRest);
  expect(et).toContain(body.prompt);
  return { outcome: bRest, boundTokenized: bt };
}

const words = (n: number, tag: string) => Array.from({ length: n }, (_, i) => `${tag}${i % 10}`).join(" ");

describe("no /tokenize when the bound decides", () => {
  it.each([false, true])("a short text prompt with max_tokens (stream %s)", async (stream) => {
    const prompt = `short prompt ${stream}`;
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 8, stream });
    expect(outcome.status).toBe(200);
    expect(outcome.spent).toBe(4 + 3); // BOS + 3 words, 3 generated: Inference's usage
    expect(boundTokenized).not.toContain(prompt);
  });

  it("learns the special tokens once (/tokenize of the empty text), then never again", async () => {
    await call(bound, { prompt: "warm up", max_tokens: 2 });
    const from = upstream.requests.length;
    await call(bound, { prompt: "one more", max_tokens: 2 });
    await call(bound, { prompt: "and another", max_tokens: 2, stream: true });
    expect(tokenized(from)).toEqual([]);
    expect(tokenized(0).filter((p) => p === "").length).toBe(1);
  });

  it("a text prompt without special tokens needs no call at all", async () => {
    const prompt = "no specials here";
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 4, add_special_tokens: false });
    expect(outcome.status).toBe(200);
    expect(boundTokenized).toEqual([]);
  });
});

describe("an exact count when the bound cannot decide", () => {
  it("a prompt whose bound + max_tokens passes max_model_len, but whose tokens fit", async () => {
    const prompt = words(100, "n"); // 299 bytes + BOS = 300 bound; 101 tokens
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 300 });
    expect(outcome.status).toBe(200);
    expect(boundTokenized).toContain(prompt);
  });

  it("a prompt too long: the refusal names the exact count", async () => {
    const prompt = words(300, "L"); // 301 tokens
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 300 });
    expect(outcome.status).toBe(400);
    expect(JSON.stringify(outcome.body)).toContain(
      "you requested 601 tokens (301 in your prompt; 300 for the completion)",
    );
    expect(outcome.spent).toBe(0);
    expect(boundTokenized).toContain(prompt);
  });

  it("the default max_tokens (max_model_len − the prompt's tokens)", async () => {
    const prompt = "default max tokens";
    const { outcome, boundTokenized } = await both({ prompt });
    expect(outcome.status).toBe(200);
    expect(boundTokenized).toContain(prompt);
  });

  it("near the end of a Budget: the clamp is the exact count's", async () => {
    const prompt = "x y z"; // bound 6, exact 4: 4 + 10 > 10 → 6
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 10 }, 10);
    expect(outcome.status).toBe(200);
    expect(outcome.clamped).toBe("6");
    expect(boundTokenized).toContain(prompt);
  });

  it("a Budget the bound does not fit but the exact count does: not clamped", async () => {
    const prompt = "p q r"; // bound 6 + 10 = 16 > 14; exact 4 + 10 = 14
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 10 }, 14);
    expect(outcome.status).toBe(200);
    expect(outcome.clamped).toBeNull();
    expect(boundTokenized).toContain(prompt);
  });

  it("a Budget that cannot hold one token: the refusal names the exact count", async () => {
    const prompt = "s t u";
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 10 }, 4);
    expect(outcome.status).toBe(429);
    expect(JSON.stringify(outcome.body)).toContain("needs at least 5 tokens (4 prompt tokens");
    expect(boundTokenized).toContain(prompt);
  });

  it("prompt_logprobs (Inference's non-streamed answer)", async () => {
    const prompt = "with prompt logprobs";
    const { outcome, boundTokenized } = await both({ prompt, max_tokens: 3, prompt_logprobs: 0 });
    expect(outcome.status).toBe(200);
    expect(boundTokenized).toContain(prompt);
  });

  it("a capture (its cap and replay)", async () => {
    const prompt = "a capture";
    const { boundTokenized } = await both({ prompt, max_tokens: 3, output_residual_stream: [0] });
    expect(boundTokenized).toContain(prompt);
  });

  it("a stream cut short before Inference told its prompt is charged the exact prompt", async () => {
    const charged = async (stack: Stack, prompt: string) => {
      const ledger = stack.ledger!;
      const { id, key } = await ledger.createKey({ budgetTokens: 1000 });
      const aborter = new AbortController();
      const seen = upstream.requests.length;
      const res = fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        body: JSON.stringify({ model: stack.alias, prompt, max_tokens: 8, stream: true }),
        signal: aborter.signal,
      }).catch(() => undefined);
      await until(
        () => upstream.requests.slice(seen).some((r) => r.url === "/v1/completions"),
        "Inference got the completion",
      );
      aborter.abort();
      await res;
      await until(async () => (await ledger.usage(id)).openHolds === 0, "the Hold is settled");
      return (await ledger.usage(id)).spentTokens;
    };
    const prompt = "hang on a long while";
    expect(await charged(bound, prompt)).toBe(await charged(exact, prompt));
    expect(await charged(exact, `${prompt} more`)).toBe(1 + 6); // BOS + 6 words, nothing generated
  });
});

describe("keys off: Inference's prompt token ids make a bounded prompt exact", () => {
  /** `acs_prompt_tokens_total` of `open` now. */
  const promptTokensTotal = async () => {
    const text = await (await fetch(`${open.url}/metrics`)).text();
    const line = text.split("\n").find((l) => l.startsWith("acs_prompt_tokens_total{"));
    return line === undefined ? 0 : Number(line.slice(line.lastIndexOf(" ") + 1));
  };
  /** One request on `open`; its usage, its access log line and the /tokenize calls it made. */
  const request = async (body: Record<string, unknown>) => {
    const from = upstream.requests.length;
    const before = await promptTokensTotal();
    const res = await fetch(`${open.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: open.alias, max_tokens: 3, ...body }),
    });
    expect(res.status).toBe(200);
    const requestId = res.headers.get("x-request-id");
    const text = await res.text();
    const usage =
      body.stream === true
        ? (JSON.parse(/data: (\{"id".*"usage":\{.*)\n/.exec(text)?.[1] ?? "{}") as { usage: unknown }).usage
        : (JSON.parse(text) as { usage: unknown }).usage;
    const isLine = (l: Record<string, unknown>) => l.requestId === requestId && l.msg === "request";
    await until(() => openLog.some(isLine), "the access log line");
    const line = openLog.find(isLine) ?? {};
    return {
      usage: usage as { prompt_tokens: number },
      line,
      counted: (await promptTokensTotal()) - before,
      tokenized: tokenized(from),
    };
  };

  it.each([false, true])(
    "the access log and acs_prompt_tokens_total count Inference's prompt tokens, not the bound (stream %s)",
    async (stream) => {
      const prompt = `three short words ${stream}`; // BOS + 4 tokens; its bound: 22 or 23 bytes + 1
      const {
        usage,
        line,
        counted,
        tokenized: calls,
      } = await request({
        prompt,
        stream,
        ...(stream ? { stream_options: { include_usage: true } } : {}),
      });
      expect(calls).not.toContain(prompt); // the bound decided: no /tokenize
      expect(usage.prompt_tokens).toBe(5);
      expect(line.promptTokens).toBe(5);
      expect(counted).toBe(5);
      // A time to first token either way: a unary call too is Inference's stream, collected.
      expect(line.ttftMs).toBeDefined();
    },
  );

  // Last in this file: from then on, `open` counts every prompt of its model exactly.
  it("a prompt longer than its bound: the model's prompts are counted exactly from then on", async () => {
    const before = await request({ prompt: "fine before" });
    expect(before.tokenized).not.toContain("fine before");
    const many = await request({ prompt: "many tokens" }); // BOS + 32 tokens; its bound is 11 + 1
    expect(many.usage.prompt_tokens).toBe(33);
    expect(many.line.promptTokens).toBe(33);
    const after = await request({ prompt: "fine after" });
    expect(after.tokenized).toContain("fine after");
    expect(after.line.promptTokens).toBe(3);
  });
});
