// GET /v1/admin/usage/completions on a real gateway (keys on, SQLite): for admin keys only, a
// strict query string (each refusal the §7 envelope naming its parameter), and OpenAI's page of
// buckets whose sums are the responses' usage.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { USAGE_COMPLETIONS_PATH } from "../../../src/surfaces/rest/usage-route.js";
import { type Stack, startStack } from "../../helpers/start-stack.js";

let dir: string;
let stack: Stack;
let adminKey: string;
let apiKey: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-usage-route-"));
  stack = await startStack({ dbPath: join(dir, "budget.db") });
  adminKey = (await stack.ledger!.createAdminKey({ name: "usage-test" })).key;
  apiKey = (await stack.ledger!.createKey({ budgetTokens: 10 })).key;
});
afterAll(async () => {
  await stack?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** GET the usage route with `query`, as an admin (or with `key`, or none). */
const get = (query: string, key: string | null = adminKey) =>
  fetch(`${stack.url}${USAGE_COMPLETIONS_PATH}?${query}`, {
    headers: key === null ? {} : { authorization: `Bearer ${key}` },
  });

/** The refusal's status and envelope fields. */
async function refusal(res: Response) {
  const body = (await res.json()) as {
    error: { param: string | null; code: string; type: string };
    request_id: string;
  };
  expect(body.request_id).toBe(res.headers.get("x-request-id"));
  return [res.status, body.error.code, body.error.param];
}

describe(`GET ${USAGE_COMPLETIONS_PATH}`, () => {
  it("checks the admin key before the query: 401 without one, 403 for an API key", async () => {
    expect(await refusal(await get("start_time=0", null))).toEqual([401, "invalid_api_key", null]);
    expect(await refusal(await get("bogus=1", null))).toEqual([401, "invalid_api_key", null]);
    expect(await refusal(await get("bogus=1", apiKey))).toEqual([403, "permission_denied", null]);
  });

  it.each([
    ["", "start_time"],
    ["start_time=abc", "start_time"],
    ["start_time=-5", "start_time"],
    ["start_time=0&start_time=1", "start_time"],
    ["start_time=0&bucket_width=1w", "bucket_width"],
    ["start_time=0&group_by=project_id", "group_by"],
    ["start_time=0&limit=32", "limit"],
    ["start_time=0&bucket_width=1h&limit=169", "limit"],
    ["start_time=0&limit=1.5", "limit"],
    ["start_time=10&end_time=10", "end_time"],
    ["start_time=0&page=nope", "page"],
    ["start_time=0&project_ids=p", "project_ids"],
    ["start_time=0&limit[]=3", "limit[]"],
  ])("refuses %j: 400 naming %s", async (query, param) => {
    expect(await refusal(await get(query))).toEqual([400, "invalid_request", param]);
  });

  it("answers OpenAI's page: buckets of the range, grouped, the sums of the responses' usage", async () => {
    const ledger = stack.ledger!;
    const k = await ledger.createKey({ budgetTokens: 100_000 });
    const usages: Array<{ prompt_tokens: number; completion_tokens: number }> = [];
    for (const max_tokens of [2, 5]) {
      const res = await fetch(`${stack.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${k.key}` },
        body: JSON.stringify({
          model: "tiny",
          prompt: "Hello",
          max_tokens,
          temperature: 0,
          ignore_eos: true,
        }),
      });
      usages.push(((await res.json()) as { usage: (typeof usages)[number] }).usage);
    }
    await ledger.usageLog.flush();
    const now = Math.floor(Date.now() / 1000);
    const start = now - 120;
    const res = await get(
      `start_time=${start}&end_time=${now + 1}&bucket_width=1m&group_by[]=model&group_by=api_key_id&api_key_ids=${k.id}&limit=10`,
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    const page = (await res.json()) as {
      object: string;
      has_more: boolean;
      next_page: string | null;
      data: Array<{
        object: string;
        start_time: number;
        end_time: number;
        results: Array<Record<string, unknown>>;
      }>;
    };
    expect(page).toMatchObject({ object: "page", has_more: false, next_page: null });
    expect(page.data.length).toBe(Math.ceil((now + 1 - Math.floor(start / 60) * 60) / 60));
    expect(page.data[0]?.start_time).toBe(start);
    expect(page.data.at(-1)?.end_time).toBe(now + 1);
    const results = page.data.flatMap((b) => b.results);
    expect(results.every((r) => r.object === "organization.usage.completions.result")).toBe(true);
    expect(results.every((r) => r.api_key_id === k.id && r.model === stack.modelId)).toBe(true);
    const sum = (f: string) => results.reduce((s, r) => s + (r[f] as number), 0);
    expect(sum("num_model_requests")).toBe(2);
    expect(sum("input_tokens")).toBe(usages.reduce((s, u) => s + u.prompt_tokens, 0));
    expect(sum("output_tokens")).toBe(7);
    // Pages of one bucket each, followed by next_page, give the same buckets.
    let cursor: string | null = null;
    const buckets: unknown[] = [];
    do {
      const p = (await (
        await get(
          `start_time=${start}&end_time=${now + 1}&bucket_width=1m&group_by=model&group_by=api_key_id&api_key_ids=${k.id}&limit=1${cursor === null ? "" : `&page=${cursor}`}`,
        )
      ).json()) as { data: unknown[]; next_page: string | null };
      buckets.push(...p.data);
      cursor = p.next_page;
    } while (cursor !== null && buckets.length < 10);
    expect(buckets).toEqual(page.data);
  });
});
