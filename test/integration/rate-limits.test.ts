// A key's rate limits through the gateway (proto/API.md §9 "Rate limits"): requests and tokens per
// minute, for the key and per model; OpenAI's x-ratelimit-* headers on every answer; 429
// `rate_limited` with Retry-After on every surface; a reservation corrected to the charge at the
// end; two gateways on one Redis share one window.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REDIS_TEST_URL, redisSkipReason } from "../helpers/redis.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let dir: string;
let stack: Stack;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-rate-limits-"));
  stack = await startStack({ dbPath: join(dir, "budget.db") });
});
afterAll(async () => {
  await stack?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A key with a large Budget and these limits. */
async function keyWith(rateLimits: Record<string, unknown>, on: Stack = stack): Promise<string> {
  return (await on.ledger!.createKey({ budgetTokens: 10_000_000, rateLimits })).key;
}

/** POST /v1/completions with `key`. */
function complete(key: string, body: Record<string, unknown> = {}, on: Stack = stack) {
  return fetch(`${on.url}/v1/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: [1, 2, 3], max_tokens: 4, ...body }),
  });
}

const header = (res: Response, name: string) => res.headers.get(name);

describe("requests per minute", () => {
  it("admits the limit, then 429 rate_limited with Retry-After; every answer carries the headers", async () => {
    const key = await keyWith({ requestsPerMinute: 3 });
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await complete(key));
    expect(answers.map((r) => r.status)).toEqual([200, 200, 200, 429]);
    expect(answers.map((r) => header(r, "x-ratelimit-remaining-requests"))).toEqual(["2", "1", "0", "0"]);
    for (const r of answers) expect(header(r, "x-ratelimit-limit-requests")).toBe("3");
    expect(header(answers[0] as Response, "x-ratelimit-reset-requests")).toMatch(
      /^\d+(\.\d+)?m?s$|^\d+m\d+(\.\d+)?s$/,
    );
    const refused = answers[3] as Response;
    expect(Number(header(refused, "retry-after"))).toBeGreaterThanOrEqual(1);
    expect(header(refused, "x-should-retry")).toBe("true");
    const body = (await refused.json()) as {
      error: { code: string; type: string; param: null; message: string };
    };
    expect(body.error).toMatchObject({ code: "rate_limited", type: "rate_limit_error", param: null });
    expect(body.error.message).toMatch(/^Rate limit reached for requests per minute: Limit 3, Requested 1\./);
    // No tokens limit: no tokens headers.
    expect(header(refused, "x-ratelimit-limit-tokens")).toBeNull();
  });

  it("a request the Budget refuses gives its entry back (it is not counted)", async () => {
    const key = (await stack.ledger!.createKey({ budgetTokens: 2, rateLimits: { requestsPerMinute: 1 } }))
      .key;
    const first = await complete(key);
    expect(first.status).toBe(429);
    expect(((await first.json()) as { error: { code: string } }).error.code).toBe("insufficient_quota");
    // Had the refused request been counted, this one would be rate_limited, not insufficient_quota.
    const second = await complete(key);
    expect(((await second.json()) as { error: { code: string } }).error.code).toBe("insufficient_quota");
  });

  it("is refused on Connect too, with the headers in its metadata", async () => {
    const key = await keyWith({ requestsPerMinute: 1 });
    const connect = () =>
      fetch(`${stack.url}/acs.v1.CompletionsService/CreateCompletion`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", tokenIds: { values: [1, 2, 3] }, maxTokens: 4 }),
      });
    const ok = await connect();
    expect(ok.status, await ok.clone().text()).toBe(200);
    expect(header(ok, "x-ratelimit-remaining-requests")).toBe("0");
    const refused = await connect();
    expect(refused.status).toBe(429);
    expect(header(refused, "x-ratelimit-limit-requests")).toBe("1");
    const body = (await refused.json()) as {
      code: string;
      details?: Array<{ debug: { error: { code: string } } }>;
    };
    expect(body.code).toBe("resource_exhausted");
    expect(body.details?.[0]?.debug.error.code).toBe("rate_limited");
  });
});

describe("tokens per minute", () => {
  it("reserves prompt + max_tokens, corrected to the charge when the request ends", async () => {
    // A choice that stops early (a stop token id seen at temperature 0) is charged less than it held.
    const free = await keyWith({});
    const probe = (await (
      await complete(free, { max_tokens: 40, temperature: 0, return_token_ids: true })
    ).json()) as {
      choices: Array<{ token_ids: number[] }>;
    };
    const stopAt = probe.choices[0]?.token_ids[4] as number;
    const key = await keyWith({ tokensPerMinute: 100 });
    const first = await complete(key, { max_tokens: 40, temperature: 0, stop_token_ids: [stopAt] });
    expect(first.status).toBe(200);
    const used = ((await first.json()) as { usage: { total_tokens: number } }).usage.total_tokens;
    expect(used).toBeLessThan(43); // it stopped early: the correction matters
    // While it ran it held 3 + 40; once it ended, only what it was charged (its usage) stays.
    const second = await complete(key, { max_tokens: 40 });
    expect(second.status).toBe(200);
    expect(Number(header(second, "x-ratelimit-remaining-tokens"))).toBe(100 - used - 43);
    expect(header(second, "x-ratelimit-limit-tokens")).toBe("100");
  });

  it("a request larger than the limit itself is refused without Retry-After (it can never fit)", async () => {
    const key = await keyWith({ tokensPerMinute: 10 });
    const res = await complete(key, { max_tokens: 20 });
    expect(res.status).toBe(429);
    expect(header(res, "retry-after")).toBeNull();
    expect(header(res, "x-should-retry")).toBe("false");
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("rate_limited");
    expect(body.error.message).toMatch(/^Request too large for tokens per minute: Limit 10, Requested 23\./);
  });

  it("limits per model apply beside the key's own", async () => {
    const key = await keyWith({ requestsPerMinute: 10, models: { "acs/tiny": { requestsPerMinute: 1 } } });
    expect((await complete(key)).status).toBe(200);
    const refused = await complete(key);
    expect(refused.status).toBe(429);
    expect(((await refused.json()) as { error: { message: string } }).error.message).toMatch(
      /^Rate limit reached for requests per minute for model acs\/tiny: Limit 1/,
    );
  });
});

describe("two gateways on one Redis", () => {
  it("share one window: a key limited to 5 per minute gets exactly 5 of 20 concurrent requests", async (ctx) => {
    const reason = await redisSkipReason();
    if (reason !== undefined) ctx.skip(reason);
    const shared = join(dir, "shared.db");
    const a = await startStack({ dbPath: shared, redisUrl: REDIS_TEST_URL });
    const b = await startStack({ dbPath: shared, redisUrl: REDIS_TEST_URL });
    try {
      const key = await keyWith({ requestsPerMinute: 5 }, a);
      const answers = await Promise.all(
        Array.from({ length: 20 }, (_, i) => complete(key, {}, i % 2 === 0 ? a : b)),
      );
      const statuses = answers.map((r) => r.status);
      expect(statuses.filter((s) => s === 200)).toHaveLength(5);
      expect(statuses.filter((s) => s === 429)).toHaveLength(15);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});
