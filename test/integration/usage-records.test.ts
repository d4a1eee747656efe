// One usage record per settled request, through the real gateway and engine on a SQLite ledger:
// unary, stream, streamed capture, lens fan-out, Connect, a refusal after the Hold and a stream
// cut short, keys and models mixed. Each row's tokens are the `usage` its response reported; the
// rows' charges are the keys' spent tokens; OpenAI's usage query sums them; the rows reach the
// store in batches, not one write per request.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { sseChunks } from "../helpers/parse-sse.js";
import { testDatabase } from "../helpers/postgres.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };
type Row = {
  key_id: string;
  model: string;
  input_tokens: number;
  output_tokens: number;
  activation_tokens: number;
  charged_tokens: number;
  status: number;
  request_id: string;
  created_at: number;
};

let dir: string;
let stack: Stack;
/** The stack a test started, closed after it. */
let running: Stack | undefined;
const SECOND = "acs/second";
const postgres = testDatabase("usage_gateway");

/** The gateway on `kind`'s store: no usage flush on its own during a test (it waits for the test's). */
async function start(kind: "sqlite" | "postgres"): Promise<void> {
  stack = await startStack({
    ...(kind === "sqlite"
      ? { dbPath: join(dir, "budget.db") }
      : { db: { kind: "postgres", url: postgres.url } }),
    extraModels: [{ id: SECOND, aliases: ["second"] }],
    usageLog: { flushIntervalMs: 3_600_000 },
  });
  running = stack;
}

/** Every usage row of the store, oldest first. */
async function rowsOf(kind: "sqlite" | "postgres"): Promise<Row[]> {
  if (kind === "sqlite") {
    const db = new Database(join(dir, "budget.db"), { readonly: true });
    const rows = db.prepare("SELECT * FROM usage_records ORDER BY id").all() as Row[];
    db.close();
    return rows;
  }
  const client = new pg.Client({ connectionString: postgres.url });
  await client.connect();
  try {
    const { rows } = await client.query<Record<string, unknown>>("SELECT * FROM usage_records ORDER BY id");
    const n = (v: unknown) => Number(v);
    return rows.map(
      (r) =>
        ({
          ...r,
          input_tokens: n(r.input_tokens),
          output_tokens: n(r.output_tokens),
          activation_tokens: n(r.activation_tokens),
          charged_tokens: n(r.charged_tokens),
          created_at: n(r.created_at),
        }) as Row,
    );
  } finally {
    await client.end();
  }
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-usage-"));
  await postgres.create();
});
afterEach(async () => {
  const started = running;
  running = undefined;
  await started?.close();
});
afterAll(async () => {
  await postgres.drop();
  rmSync(dir, { recursive: true, force: true });
});

/** POST /v1/completions with `key`. */
function post(key: string, body: Record<string, unknown>, signal?: AbortSignal): Promise<Response> {
  return fetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({ temperature: 0, ignore_eos: true, ...body }),
    ...(signal === undefined ? {} : { signal }),
  });
}

/** The usage a REST response reported: a unary answer's, or a stream's usage chunk. */
async function usageOf(res: Response, stream: boolean): Promise<Usage> {
  if (!stream) return ((await res.json()) as { usage: Usage }).usage;
  const chunks = sseChunks(await res.text()) as Array<{ usage?: Usage | null }>;
  const usage = chunks.find((c) => c.usage)?.usage;
  if (usage == null) throw new Error("the stream reported no usage");
  return usage;
}

/** Waits until `check` holds (polling every 20 ms, at most 5 s). */
async function until(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 250 && !check(); i++) await new Promise((r) => setTimeout(r, 20));
  if (!check()) throw new Error(`timed out waiting: ${what}`);
}

describe.each(["sqlite", "postgres"] as const)("usage records through the gateway on %s", (kind) => {
  it("one row per request with a Hold; its tokens are the response's usage; the sums are the query's", async (ctx) => {
    if (kind === "postgres" && postgres.skipReason !== undefined) ctx.skip(postgres.skipReason);
    await start(kind);
    const ledger = stack.ledger!;
    const log = ledger.usageLog;
    const a = await ledger.createKey({ name: "a", budgetTokens: 1_000_000 });
    const b = await ledger.createKey({ name: "b", budgetTokens: 1_000_000 });
    const before = { written: log.written, flushes: log.flushes };

    // Answered requests, at once: keys, models, kinds and surfaces mixed.
    const answered: Array<{
      key: { id: string; key: string };
      model: string;
      run: () => Promise<Response>;
      stream: boolean;
    }> = [
      {
        key: a,
        model: stack.modelId,
        stream: false,
        run: () => post(a.key, { model: "tiny", prompt: "Hi", max_tokens: 5 }),
      },
      {
        key: b,
        model: SECOND,
        stream: false,
        run: () => post(b.key, { model: "second", prompt: ["one", "two"], max_tokens: 3 }),
      },
      {
        key: a,
        model: SECOND,
        stream: true,
        run: () =>
          post(a.key, {
            model: SECOND,
            prompt: "Hello there",
            max_tokens: 6,
            stream: true,
            stream_options: { include_usage: true },
          }),
      },
      {
        key: b,
        model: stack.modelId,
        stream: true, // a streamed capture: its replay is activation tokens
        run: () =>
          post(b.key, {
            model: "tiny",
            prompt: "Hi",
            max_tokens: 4,
            stream: true,
            stream_options: { include_usage: true },
            output_residual_stream: [0],
          }),
      },
      {
        key: a,
        model: stack.modelId,
        stream: false, // a lens fan-out: 2 prompts × n 2, one Inference request each
        run: () =>
          post(a.key, {
            model: "tiny",
            prompt: ["a b", "c"],
            n: 2,
            seed: 7,
            temperature: 1,
            max_tokens: 3,
            output_residual_stream: [0],
          }),
      },
      {
        key: b,
        model: SECOND,
        stream: false, // Connect
        run: () =>
          fetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
            method: "POST",
            headers: { "content-type": "application/json", authorization: `Bearer ${b.key}` },
            body: JSON.stringify({ model: SECOND, text: "Hey", maxTokens: 4, temperature: 0 }),
          }),
      },
    ];
    const responses = await Promise.all(answered.map((r) => r.run()));
    const reported = await Promise.all(
      responses.map(async (res, i) => {
        if (res.status !== 200) throw new Error(`request ${i}: ${res.status} ${await res.clone().text()}`);
        const id = res.headers.get("x-request-id") ?? "";
        if (i === 5) {
          const u = ((await res.json()) as { usage: { promptTokens: number; completionTokens: number } })
            .usage;
          return { id, usage: { prompt_tokens: u.promptTokens, completion_tokens: u.completionTokens } };
        }
        return { id, usage: await usageOf(res, answered[i]!.stream) };
      }),
    );

    // Refused after its Hold: Inference refuses a token id out of its vocabulary (400), charged 0.
    const refused = await post(a.key, { model: "tiny", prompt: [10_000_000], max_tokens: 3 });
    expect(refused.status).toBe(400);
    const refusedId = refused.headers.get("x-request-id") ?? "";
    await refused.text();
    // Refused before a Hold: no row (an unknown key, a max_tokens out of range).
    expect((await post("acs-nope", { model: "tiny", prompt: "Hi", max_tokens: 3 })).status).toBe(401);
    expect((await post(a.key, { model: "tiny", prompt: "Hi", max_tokens: -1 })).status).toBe(400);
    // A stream cut short by its caller after its first chunk.
    const stop = new AbortController();
    const cut = await post(
      b.key,
      { model: "tiny", prompt: "Go", max_tokens: 400, stream: true },
      stop.signal,
    );
    const cutId = cut.headers.get("x-request-id") ?? "";
    const reader = cut.body!.getReader();
    await reader.read();
    stop.abort();
    await reader.cancel().catch(() => undefined);

    const requests = answered.length + 2;
    // The request path wrote no row: all of them wait in memory, none written yet ...
    await until(() => log.queued === requests, "every request's record queued");
    expect(log.written - before.written).toBe(0);
    const count = async () => (await rowsOf(kind)).length;
    expect(await count()).toBe(0);
    // ... and one flush writes them all, in one INSERT.
    await log.flush();
    expect({ written: log.written - before.written, flushes: log.flushes - before.flushes }).toEqual({
      written: requests,
      flushes: 1,
    });
    expect(await count()).toBe(requests);
    expect(log.dropped).toBe(0);

    const rows = await rowsOf(kind);
    const mine = rows.filter((r) => r.key_id === a.id || r.key_id === b.id);
    expect(mine).toHaveLength(requests);
    const byId = new Map(mine.map((r) => [r.request_id, r]));
    expect(byId.size).toBe(requests);
    for (const [i, { id, usage }] of reported.entries()) {
      const row = byId.get(id);
      expect(row, `row of request ${i}`).toBeDefined();
      expect(row).toMatchObject({
        key_id: answered[i]!.key.id,
        model: answered[i]!.model,
        input_tokens: usage.prompt_tokens,
        output_tokens: usage.completion_tokens,
        status: 200,
      });
      // Charged what was used: the response's usage, plus a streamed capture's replay.
      expect(row!.charged_tokens).toBe(row!.input_tokens + row!.output_tokens + row!.activation_tokens);
      expect(row!.activation_tokens).toBe(i === 3 ? usage.prompt_tokens + usage.completion_tokens - 1 : 0);
    }
    expect(byId.get(refusedId)).toMatchObject({
      status: 400,
      input_tokens: 0,
      output_tokens: 0,
      charged_tokens: 0,
    });
    const cutRow = byId.get(cutId);
    expect(cutRow).toMatchObject({ status: 499, key_id: b.id, model: stack.modelId });
    expect(cutRow!.output_tokens).toBeGreaterThan(0);
    expect(cutRow!.output_tokens).toBeLessThan(400);
    expect(cutRow!.charged_tokens).toBe(cutRow!.input_tokens + cutRow!.output_tokens);
    // The rows' charges are what the keys were charged (a lease's charges reach the store at its step).
    await ledger.syncLeases();
    for (const key of [a, b]) {
      const charged = mine.filter((r) => r.key_id === key.id).reduce((s, r) => s + r.charged_tokens, 0);
      expect((await ledger.usage(key.id)).spentTokens).toBe(charged);
    }

    // OpenAI's query: per key and model, the buckets' sums are the responses' usage (and the cut row's).
    const now = Date.now();
    const page = await ledger.usageCompletions({
      startTime: Math.floor(now / 1000) - 3600,
      endTime: Math.floor(now / 1000) + 1,
      bucketWidth: "1h",
      groupBy: ["api_key_id", "model"],
      apiKeyIds: [a.id, b.id],
    });
    const sums = new Map<string, { input: number; output: number; n: number }>();
    const add = (k: string, input: number, output: number) => {
      const s = sums.get(k) ?? { input: 0, output: 0, n: 0 };
      sums.set(k, { input: s.input + input, output: s.output + output, n: s.n + 1 });
    };
    for (const [i, { usage }] of reported.entries()) {
      add(`${answered[i]!.key.id} ${answered[i]!.model}`, usage.prompt_tokens, usage.completion_tokens);
    }
    add(`${a.id} ${stack.modelId}`, 0, 0);
    add(`${b.id} ${stack.modelId}`, cutRow!.input_tokens, cutRow!.output_tokens);
    const got = new Map<string, { input: number; output: number; n: number }>();
    for (const r of page.data.flatMap((bucket) => bucket.results)) {
      const k = `${r.api_key_id} ${r.model}`;
      const s = got.get(k) ?? { input: 0, output: 0, n: 0 };
      got.set(k, {
        input: s.input + r.input_tokens,
        output: s.output + r.output_tokens,
        n: s.n + r.num_model_requests,
      });
    }
    expect(got).toEqual(sums);
  });
});
