// Keys, Budgets and Holds through the real gateway, engine and SQLite file.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { until } from "../helpers/hang-guard.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let dir: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-budget-"));
  stack = await startStack({ dbPath: join(dir, "acs.db") });
});
afterAll(async () => {
  await stack.close();
  rmSync(dir, { recursive: true, force: true });
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

const ledger = () => {
  if (!stack.ledger) throw new Error("no ledger");
  return stack.ledger;
};

const connect = () =>
  createClient(CompletionsService, createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }));

async function rest(body: Record<string, unknown>, authorization?: string): Promise<Response> {
  return checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(authorization ? { authorization } : {}) },
    body: JSON.stringify({ model: "tiny", ...body }),
  });
}

const small = { prompt: "Hi", max_tokens: 2, temperature: 0, ignore_eos: true };
/** "Hi" with BOS in the byte-level tiny tokenizer. */
const promptTokens = 3;

describe("authentication, REST and Connect alike", () => {
  const cases: Array<[string, (key: string) => string | undefined]> = [
    ["missing header", () => undefined],
    ["wrong scheme", (key) => `Basic ${key}`],
    ["unknown key", () => "Bearer acs-0000000000000000000000000000000000000000000"],
    ["revoked key", (key) => `Bearer ${key}`],
  ];
  it.each(cases)("%s → 401 invalid_api_key", async (name, header) => {
    const { id, key } = await ledger().createKey({ budgetTokens: 1000 });
    if (name === "revoked key") await ledger().revoke(id);
    const authorization = header(key);
    const res = await rest(small, authorization);
    expect(res.status).toBe(401);
    const json = (await res.json()) as { error: Record<string, unknown>; request_id: string };
    expect(json.error).toMatchObject({ type: "invalid_request_error", code: "invalid_api_key", param: null });

    const err = await connect()
      .createCompletion(
        create(CreateCompletionRequestSchema, {
          model: "tiny",
          prompt: { case: "text", value: "Hi" },
          maxTokens: 2,
        }),
        {
          headers: authorization ? { authorization } : {},
        },
      )
      .then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    expect(err?.code).toBe(Code.Unauthenticated);
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0];
    expect(envelope?.error?.code).toBe("invalid_api_key");
    expect(envelope?.error?.message).toBe(json.error.message);
  });

  it("lets a good key through and charges its usage", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 1000 });
    const res = await rest(small, `Bearer ${key}`);
    expect(res.status).toBe(200);
    const json = (await res.json()) as { usage: { total_tokens: number } };
    const usage = await ledger().usage(id);
    expect(usage.spentTokens).toBe(json.usage.total_tokens);
    expect(usage.openHolds).toBe(0);
  });
});

describe("the clamp near the end of a Budget", () => {
  it("lowers max_tokens and says so in X-Acs-Max-Tokens-Clamped (REST, openai SDK, Connect)", async () => {
    const { key } = await ledger().createKey({ budgetTokens: promptTokens + 3 });
    const client = new OpenAI({
      baseURL: `${stack.url}/v1`,
      apiKey: key,
      maxRetries: 0,
      fetch: checkedFetch,
    });
    const { data, response } = await client.completions
      .create({
        model: "tiny",
        prompt: "Hi",
        max_tokens: 10,
        temperature: 0,
        ignore_eos: true,
      } as OpenAI.CompletionCreateParamsNonStreaming)
      .withResponse();
    expect(response.headers.get("x-acs-max-tokens-clamped")).toBe("3");
    expect(data.usage?.completion_tokens).toBe(3);

    const second = await ledger().createKey({ budgetTokens: promptTokens + 2 });
    let clamped: string | null = null;
    const res = await connect().createCompletion(
      create(CreateCompletionRequestSchema, {
        model: "tiny",
        prompt: { case: "text", value: "Hi" },
        maxTokens: 10,
        temperature: 0,
        ignoreEos: true,
      }),
      {
        headers: { authorization: `Bearer ${second.key}` },
        onHeader: (h) => (clamped = h.get("x-acs-max-tokens-clamped")),
      },
    );
    expect(clamped).toBe("2");
    expect(res.usage?.completionTokens).toBe(2);
  });

  it("refuses with 429 insufficient_quota when not one token fits", async () => {
    const { key } = await ledger().createKey({ budgetTokens: promptTokens });
    const res = await rest(small, `Bearer ${key}`);
    expect(res.status).toBe(429);
    const json = (await res.json()) as { error: Record<string, unknown> };
    expect(json.error).toMatchObject({ type: "insufficient_quota", code: "insufficient_quota" });
  });
});

describe("concurrency", () => {
  it("500 simultaneous requests against a Budget that fits 100: exactly 100 served, never over the Budget while they run, all settled, charges = usage", async () => {
    // Every request uses its whole Hold (ignore_eos, greedy, max_tokens 2): the Budget fits exactly
    // 100 of them, and not one token of a 101st (no clamp can help it).
    const perRequest = promptTokens + small.max_tokens;
    const budget = 100 * perRequest;
    const { id, key } = await ledger().createKey({ budgetTokens: budget });
    // What the Budget has committed (spent + held), sampled on every turn of the event loop while
    // the requests run; the database's CHECK only bounds the spent part.
    const samples: { committed: number; openHolds: number }[] = [];
    let running = true;
    const sampling = (async () => {
      while (running) {
        const u = await ledger().usage(id);
        samples.push({ committed: u.spentTokens + u.heldTokens, openHolds: u.openHolds });
        await new Promise((resolve) => setImmediate(resolve));
      }
    })();
    const results = await Promise.all(
      Array.from({ length: 500 }, async (_, i) => {
        const res = await rest(
          {
            ...small,
            stream: i % 2 === 0,
            ...(i % 2 === 0 ? { stream_options: { include_usage: true } } : {}),
          },
          `Bearer ${key}`,
        );
        const text = await res.text();
        if (res.status !== 200) return { status: res.status, used: 0 };
        if (i % 2 === 1)
          return {
            status: 200,
            used: (JSON.parse(text) as { usage: { total_tokens: number } }).usage.total_tokens,
          };
        const usageEvent = sseChunks<{ usage?: { total_tokens: number } | null }>(text).find((c) => c.usage);
        return { status: 200, used: usageEvent?.usage?.total_tokens ?? 0 };
      }),
    ).finally(() => {
      running = false;
    });
    await sampling;
    const ok = results.filter((r) => r.status === 200);
    const refused = results.filter((r) => r.status === 429);
    expect([ok.length, refused.length]).toEqual([100, 400]);
    expect(samples.some((s) => s.openHolds > 0)).toBe(true); // sampled while requests were in flight
    expect(samples.filter((s) => s.committed > budget)).toEqual([]);
    const usage = await ledger().usage(id);
    expect(usage.openHolds).toBe(0);
    expect(usage.spentTokens).toBe(ok.reduce((a, r) => a + r.used, 0));
    expect(usage.spentTokens).toBe(budget);
  });
});

describe("settle on disconnect", () => {
  it("a caller that goes away mid-stream is charged what was generated, and the Hold is closed", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 100_000 });
    const controller = new AbortController();
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 400, ignore_eos: true, stream: true }),
      signal: controller.signal,
    });
    const reader = res.body?.getReader();
    await reader?.read();
    controller.abort();
    await until(async () => (await ledger().usage(id)).openHolds === 0, "the Hold was settled");
    const spent = (await ledger().usage(id)).spentTokens;
    expect(spent).toBeGreaterThanOrEqual(promptTokens);
    expect(spent).toBeLessThan(promptTokens + 400);
  });
});

describe("model allow-lists", () => {
  it("a key restricted to other models gets 403 model_not_allowed; an alias in the list is enough", async () => {
    const other = await ledger().createKey({ budgetTokens: 1000, models: ["some/other-model"] });
    const res = await rest(small, `Bearer ${other.key}`);
    expect(res.status).toBe(403);
    const json = (await res.json()) as { error: Record<string, unknown> };
    expect(json.error).toMatchObject({
      type: "invalid_request_error",
      code: "model_not_allowed",
      param: "model",
    });

    const byAlias = await ledger().createKey({ budgetTokens: 1000, models: ["tiny"] });
    expect((await rest(small, `Bearer ${byAlias.key}`)).status).toBe(200);
  });

  it("a key lists the models it may use: GET /v1/models through the openai SDK, and /v1/models/{id} of another is 404", async () => {
    const sdk = (apiKey: string) => new OpenAI({ apiKey, baseURL: `${stack.url}/v1`, maxRetries: 0 });
    const ids = async (apiKey: string) => (await sdk(apiKey).models.list()).data.map((m) => m.id);
    const open = await ledger().createKey({ budgetTokens: 1000 });
    const other = await ledger().createKey({ budgetTokens: 1000, models: ["some/other-model"] });
    const byAlias = await ledger().createKey({ budgetTokens: 1000, models: ["tiny"] });
    const all = await ids(open.key);
    expect(all.length).toBeGreaterThan(0);
    expect(await ids(other.key)).toEqual([]);
    expect(await ids(byAlias.key)).toEqual(all);
    const res = await checkedFetch(`${stack.url}/v1/models/tiny`, {
      headers: { authorization: `Bearer ${other.key}` },
    });
    expect(res.status).toBe(404);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("model_not_found");
    const allowed = await checkedFetch(`${stack.url}/v1/models/tiny`, {
      headers: { authorization: `Bearer ${byAlias.key}` },
    });
    expect(allowed.status).toBe(200);
  });
});

describe("settle of a non-streamed request cut short", () => {
  it("charges the prompt and the tokens generated until the caller disconnected", async () => {
    const { id, key } = await ledger().createKey({ budgetTokens: 100_000 });
    const controller = new AbortController();
    const engine = stack.engine;
    if (!engine) throw new Error("no engine");
    const request = checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
      body: JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 400, ignore_eos: true }),
      signal: controller.signal,
    }).catch(() => undefined);
    await until(() => engine.stats.active > 0, "the engine is generating");
    controller.abort();
    await request;
    await until(async () => (await ledger().usage(id)).openHolds === 0, "the Hold was settled");
    const spent = (await ledger().usage(id)).spentTokens;
    expect(spent).toBeGreaterThanOrEqual(promptTokens);
    expect(spent).toBeLessThan(promptTokens + 400);
  });
});
