/** Loopback tests of the vLLM HTTP contract on the tiny preset (real server on 127.0.0.1:0). */
import { request } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { until } from "../helpers/hang-guard.js";
import { chunkChoices, postJson, postSse } from "./helpers.js";

let engine: RunningEngine;
let url: string;
beforeAll(async () => {
  engine = await startEngine({ preset: "tiny" });
  url = `${engine.url}/v1/completions`;
});
afterAll(async () => {
  await engine.close();
});

const base = { model: "acs/tiny", prompt: "Alice was", max_tokens: 12, temperature: 1, seed: 7 };

interface Choice {
  index: number;
  text: string;
  finish_reason: string | null;
  stop_reason: string | number | null;
  token_ids?: number[];
  prompt_token_ids?: number[];
  logprobs: {
    text_offset: number[];
    token_logprobs: (number | null)[];
    tokens: string[];
    top_logprobs: (Record<string, number> | null)[];
  } | null;
  prompt_logprobs?:
    | (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[]
    | null;
}

describe("routes", () => {
  it("GET /v1/models lists the served model with max_model_len", async () => {
    const r = (await (await fetch(`${engine.url}/v1/models`)).json()) as {
      object: string;
      data: Record<string, unknown>[];
    };
    expect(r.object).toBe("list");
    expect(r.data).toHaveLength(1);
    expect(r.data[0]).toMatchObject({
      id: "acs/tiny",
      object: "model",
      owned_by: "vllm",
      root: "acs/tiny",
      parent: null,
      max_model_len: 512,
    });
    expect(typeof r.data[0]!.created).toBe("number");
  });

  it("GET /health is 200 and /version answers", async () => {
    expect((await fetch(`${engine.url}/health`)).status).toBe(200);
    expect(((await (await fetch(`${engine.url}/version`)).json()) as { version: string }).version).toMatch(
      /^\d+\.\d+/,
    );
  });

  it("POST /tokenize and /detokenize round-trip (BOS unless add_special_tokens false)", async () => {
    const t = await postJson(`${engine.url}/tokenize`, { model: "acs/tiny", prompt: "héllo" });
    expect(t.json).toMatchObject({
      count: 7,
      max_model_len: 512,
      tokens: [256, 104, 0xc3, 0xa9, 108, 108, 111],
    });
    const t2 = await postJson(`${engine.url}/tokenize`, {
      model: "acs/tiny",
      prompt: "hi",
      add_special_tokens: false,
    });
    expect(t2.json.tokens).toEqual([104, 105]);
    const d = await postJson(`${engine.url}/detokenize`, { model: "acs/tiny", tokens: [104, 0xc3, 0xa9] });
    expect(d.json).toEqual({ prompt: "hé" });
  });

  it("unknown model → 404 NotFoundError envelope", async () => {
    const r = await postJson(url, { ...base, model: "nope" });
    expect(r.status).toBe(404);
    expect(r.json).toEqual({
      error: {
        message: "The model `nope` does not exist.",
        type: "NotFoundError",
        param: "model",
        code: 404,
      },
    });
  });

  it("vLLM's own 400s", async () => {
    const cases: [Record<string, unknown>, string | null][] = [
      [{ ...base, n: 2, temperature: 0 }, "n"],
      [{ ...base, stream_options: { include_usage: true } }, "stream_options"],
      [{ ...base, stream: true, prompt_logprobs: 1 }, "prompt_logprobs"],
      [{ ...base, top_p: 0 }, "top_p"],
      [{ ...base, max_tokens: "x" }, "max_tokens"],
      [{ ...base, logprobs: 21 }, "logprobs"],
      [{ ...base, prompt: [1, 2, 999] }, "prompt"],
    ];
    for (const [body, param] of cases) {
      const r = await postJson(url, body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      const err = r.json.error as Record<string, unknown>;
      expect(err).toMatchObject({ type: "BadRequestError", code: 400, param });
      expect(typeof err.message).toBe("string");
    }
  });

  it("prompt too long → 400 with vLLM's message and param input_tokens", async () => {
    const r = await postJson(url, { ...base, prompt: "a".repeat(500), max_tokens: 20 });
    expect(r.status).toBe(400);
    const err = r.json.error as Record<string, unknown>;
    expect(err.param).toBe("input_tokens");
    expect(err.message).toMatch(
      /^You passed 501 input tokens and requested 20 output tokens\. However, the model's context length is only 512 tokens, /,
    );
  });

  it("unknown fields are ignored; X-Request-Id sets the id", async () => {
    const r = await postJson(url, { ...base, whatever: { a: 1 }, best_of: 1 }, { "x-request-id": "abc123" });
    expect(r.status).toBe(200);
    expect(r.json.id).toBe("cmpl-abc123");
  });
});

describe("completions", () => {
  it("non-stream: shape, usage, return_token_ids, logprobs", async () => {
    const r = await postJson(url, { ...base, logprobs: 2, return_token_ids: true });
    expect(r.status).toBe(200);
    expect(r.json).toMatchObject({ object: "text_completion", model: "acs/tiny" });
    expect(r.json.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
    const [c] = r.json.choices as Choice[];
    expect(c!.index).toBe(0);
    expect(c!.prompt_token_ids).toEqual(
      [256, ..."Alice was"].map((ch) => (typeof ch === "number" ? ch : ch.charCodeAt(0))),
    );
    expect(c!.token_ids!.length).toBeGreaterThan(0);
    expect(r.json.usage).toEqual({
      prompt_tokens: 10,
      completion_tokens: c!.token_ids!.length,
      total_tokens: 10 + c!.token_ids!.length,
    });
    const lp = c!.logprobs!;
    expect(lp.tokens).toHaveLength(c!.token_ids!.length);
    expect(lp.token_logprobs.every((x) => typeof x === "number" && x <= 0)).toBe(true);
    expect(lp.top_logprobs.every((d) => d !== null && Object.keys(d).length >= 2)).toBe(true);
    expect(lp.text_offset[0]).toBe(0);
    expect(c!.prompt_logprobs).toBeNull();
  });

  it("same seed → same tokens; different seed → different tokens (temperature 1)", async () => {
    const ask = async (seed: number) =>
      (
        (await postJson(url, { ...base, seed, max_tokens: 24, return_token_ids: true })).json
          .choices as Choice[]
      )[0]!.token_ids;
    expect(await ask(11)).toEqual(await ask(11));
    expect(await ask(11)).not.toEqual(await ask(12));
  });

  it("greedy is deterministic and max_tokens gives finish_reason length", async () => {
    const body = { ...base, temperature: 0, max_tokens: 9, ignore_eos: true, return_token_ids: true };
    const a = (await postJson(url, body)).json.choices as Choice[];
    const b = (await postJson(url, body)).json.choices as Choice[];
    expect(a[0]!.token_ids).toEqual(b[0]!.token_ids);
    expect(a[0]!.token_ids).toHaveLength(9);
    expect(a[0]!.finish_reason).toBe("length");
    expect(a[0]!.stop_reason).toBeNull();
  });

  it("several prompts × n = 2: index = prompt_idx × n + k; seed + k per sample", async () => {
    const r = await postJson(url, { ...base, prompt: ["one", "two"], n: 2, seed: 5, return_token_ids: true });
    const choices = r.json.choices as Choice[];
    expect(choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(choices[0]!.prompt_token_ids).toEqual([256, 111, 110, 101]);
    expect(choices[2]!.prompt_token_ids).toEqual([256, 116, 119, 111]);
    // sample k of n uses seed + k: sample 1 with seed 5 equals sample 0 with seed 6
    const single = await postJson(url, { ...base, prompt: "one", seed: 6, return_token_ids: true });
    expect((single.json.choices as Choice[])[0]!.token_ids).toEqual(choices[1]!.token_ids);
    const usage = r.json.usage as Record<string, number>;
    expect(usage.prompt_tokens).toBe(8);
    expect(usage.completion_tokens).toBe(choices.reduce((a, c) => a + c.token_ids!.length, 0));
  });

  it("stop_token_ids: stop_reason is the integer id", async () => {
    const r0 = await postJson(url, {
      ...base,
      temperature: 0,
      max_tokens: 20,
      ignore_eos: true,
      return_token_ids: true,
    });
    const ids = (r0.json.choices as Choice[])[0]!.token_ids!;
    const target = ids[3]!;
    const r = await postJson(url, {
      ...base,
      temperature: 0,
      max_tokens: 20,
      ignore_eos: true,
      return_token_ids: true,
      stop_token_ids: [target],
    });
    const c = (r.json.choices as Choice[])[0]!;
    const at = ids.indexOf(target);
    expect(c.finish_reason).toBe("stop");
    expect(c.stop_reason).toBe(target);
    expect(c.token_ids).toEqual(ids.slice(0, at + 1));
    expect(c.text).toBe(Buffer.from(ids.slice(0, at)).toString("utf8"));
  });

  it("stop string split across tokens: text cut before it, held back in the stream, kept with include_stop_str_in_output", async () => {
    const body = { ...base, temperature: 0, max_tokens: 40, ignore_eos: true };
    const full = ((await postJson(url, body)).json.choices as Choice[])[0]!.text;
    const stop = full.slice(5, 8);
    expect(stop.length).toBe(3);
    const at = full.indexOf(stop);
    const r = await postJson(url, { ...body, stop: [stop, "zzzz"] });
    const c = (r.json.choices as Choice[])[0]!;
    expect(c).toMatchObject({ text: full.slice(0, at), finish_reason: "stop", stop_reason: stop });
    const inc = await postJson(url, { ...body, stop: stop, include_stop_str_in_output: true });
    expect((inc.json.choices as Choice[])[0]!.text).toBe(full.slice(0, at + 3));
    const s = await postSse(url, { ...body, stop: [stop], stream: true });
    const chunks = chunkChoices(s.events);
    expect(chunks.map((x) => x.text).join("")).toBe(full.slice(0, at));
    expect(chunks.at(-1)).toMatchObject({ finish_reason: "stop", stop_reason: stop });
    // no chunk ever carried a proper prefix of the stop string that was later removed
    let soFar = "";
    for (const ch of chunks) {
      soFar += ch.text;
      expect(full.slice(0, at).startsWith(soFar)).toBe(true);
    }
  });

  it("stream: SSE shape, one choice per chunk, usage chunk, [DONE], no event:/id: lines", async () => {
    const s = await postSse(url, {
      ...base,
      prompt: ["a", "b"],
      n: 2,
      stream: true,
      stream_options: { include_usage: true },
      return_token_ids: true,
    });
    expect(s.status).toBe(200);
    expect(s.contentType).toMatch(/^text\/event-stream/);
    expect(s.events.every((e) => e.event === undefined && e.id === undefined)).toBe(true);
    expect(s.events.at(-1)!.data).toBe("[DONE]");
    const json = s.events.slice(0, -1).map((e) => e.json!);
    const usageChunk = json.at(-1)!;
    expect(usageChunk.choices).toEqual([]);
    const data = json.slice(0, -1);
    expect(data.every((c) => (c.choices as unknown[]).length === 1 && c.object === "text_completion")).toBe(
      true,
    );
    expect(new Set(data.map((c) => c.id)).size).toBe(1);
    const byIndex = new Map<number, { text: string; ids: number[]; finish: string | null }>();
    for (const ch of chunkChoices(s.events)) {
      const e = byIndex.get(ch.index) ?? { text: "", ids: [], finish: null };
      expect(e.finish).toBeNull();
      e.text += ch.text;
      e.ids.push(...(ch.token_ids ?? []));
      e.finish = ch.finish_reason;
      byIndex.set(ch.index, e);
    }
    expect([...byIndex.keys()].sort()).toEqual([0, 1, 2, 3]);
    const nonStream = await postJson(url, { ...base, prompt: ["a", "b"], n: 2, return_token_ids: true });
    for (const c of nonStream.json.choices as Choice[]) {
      expect(byIndex.get(c.index)).toEqual({ text: c.text, ids: c.token_ids, finish: c.finish_reason });
    }
    const total = [...byIndex.values()].reduce((a, e) => a + e.ids.length, 0);
    expect(usageChunk.usage).toEqual({ prompt_tokens: 4, completion_tokens: total, total_tokens: 4 + total });
  });

  it("a multi-byte character split across byte tokens is never emitted as U+FFFD mid-stream", async () => {
    // only the three bytes of "€" (E2 82 AC) may be sampled; seeded, so "€" appears among invalid runs
    const body = {
      ...base,
      prompt: "x",
      max_tokens: 60,
      allowed_token_ids: [0xe2, 0x82, 0xac],
      ignore_eos: true,
      seed: 3,
    };
    const nonStream = ((await postJson(url, body)).json.choices as Choice[])[0]!.text;
    expect(nonStream).toContain("€");
    const s = await postSse(url, { ...body, stream: true });
    const chunks = chunkChoices(s.events);
    expect(chunks.map((c) => c.text).join("")).toBe(nonStream);
    // the joined stream has as many "€" and U+FFFD as the final text: no character was split
    const count = (t: string, ch: string) => t.split(ch).length - 1;
    const streamed = chunks.map((c) => c.text);
    expect(streamed.reduce((a, t) => a + count(t, "€"), 0)).toBe(count(nonStream, "€"));
    expect(streamed.reduce((a, t) => a + count(t, "\uFFFD"), 0)).toBe(count(nonStream, "\uFFFD"));
    expect(chunks.some((c) => c.text === "")).toBe(true);
  });

  it("echo + prompt_logprobs: prompt text first; first prompt_logprobs entry null", async () => {
    const r = await postJson(url, { ...base, echo: true, prompt_logprobs: 1, logprobs: 1, max_tokens: 3 });
    const c = (r.json.choices as Choice[])[0]!;
    expect(c.text.startsWith("Alice was")).toBe(true);
    expect(c.prompt_logprobs![0]).toBeNull();
    expect(c.prompt_logprobs).toHaveLength(10);
    const second = c.prompt_logprobs![1]!;
    expect(second["65"]).toMatchObject({ decoded_token: "A" });
    expect(second["65"]!.rank).toBeGreaterThanOrEqual(1);
    expect(c.logprobs!.tokens.slice(0, 10).join("")).toBe("<|begin_of_text|>Alice was");
    expect(c.logprobs!.token_logprobs[0]).toBeNull();
    expect(c.logprobs!.top_logprobs[0]).toBeNull();
  });

  it("in-band error on a stream: logprobs > 20 and out-of-vocabulary ids after the 200", async () => {
    for (const body of [
      { ...base, stream: true, logprobs: 21 },
      { ...base, stream: true, prompt: [1, 2, 300] },
    ]) {
      const s = await postSse(url, body);
      expect(s.status).toBe(200);
      expect(s.events).toHaveLength(2);
      const err = s.events[0]!.json!.error as Record<string, unknown>;
      expect(err).toMatchObject({ type: "BadRequestError", code: 400 });
      expect(String(err.message)).toMatch(/greater than max allowed: 20|Token id 300 is out of vocabulary/);
      expect(s.events[1]!.data).toBe("[DONE]");
    }
  });

  it("concurrent requests progress together", async () => {
    const order: number[] = [];
    const run = async (i: number) => {
      const r = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...base, max_tokens: 200, ignore_eos: true, stream: true }),
      });
      const reader = r.body!.getReader();
      let first = true;
      for (;;) {
        const { done } = await reader.read();
        if (done) break;
        if (first) {
          order.push(i);
          first = false;
        }
      }
      order.push(i + 10);
    };
    await Promise.all([run(1), run(2)]);
    // both streams started before either finished
    expect(order.slice(0, 2).sort()).toEqual([1, 2]);
  });
});

describe("stats", () => {
  it("received counts every completion request that reached the server, refused or not; completed only those served", async () => {
    const before = { ...engine.stats };
    expect((await postJson(url, { ...base, top_p: 0 })).status).toBe(400);
    const bad = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{",
    });
    expect(bad.status).toBe(400);
    expect((await postJson(url, { ...base, max_tokens: 1 })).status).toBe(200);
    expect(engine.stats.received).toBe(before.received + 3);
    expect(engine.stats.completed).toBe(before.completed + 1);
  });
});

describe("client disconnect aborts generation", () => {
  const abortWith = async (stream: boolean) => {
    const before = engine.stats.aborted;
    const aborted = new Promise<string>((resolve) => engine.events.once("abort", resolve));
    const req = request(url, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": `abort-${stream}` },
    });
    req.on("error", () => {});
    req.end(JSON.stringify({ ...base, prompt: "x", max_tokens: 500, ignore_eos: true, stream }));
    if (stream) {
      await new Promise<void>((resolve) => req.on("response", (res) => res.once("data", () => resolve())));
    } else {
      await until(() => engine.stats.active > 0, "the engine is generating");
    }
    req.destroy();
    expect(await aborted).toBe(`cmpl-abort-${stream}`);
    expect(engine.stats.aborted).toBe(before + 1);
    expect(engine.stats.active).toBe(0);
  };
  it("stream", async () => abortWith(true));
  it("non-stream", async () => abortWith(false));
});

describe("priority (vLLM --scheduling-policy)", () => {
  it("accepts a non-zero priority under the priority policy and refuses it under fcfs, as vLLM does", async () => {
    const fcfs = await startEngine({ preset: "tiny", schedulingPolicy: "fcfs" });
    try {
      const body = { prompt: "Hi", max_tokens: 1, priority: 2 };
      const ok = await postJson(`${engine.url}/v1/completions`, body);
      expect(ok.status).toBe(200);
      const refused = await postJson(`${fcfs.url}/v1/completions`, body);
      expect(refused.status).toBe(400);
      expect((refused.json as { error: { param: string } }).error.param).toBe("priority");
    } finally {
      await fcfs.close();
    }
  });
});
