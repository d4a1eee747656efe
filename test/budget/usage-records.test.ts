// The usage records on both stores: the batched writes of the usage log (one INSERT per flush) and
// OpenAI's completions usage query over them — buckets equal the sums of their rows, whatever the
// group_by, the bucket width, the page and the time bounds; both stores answer alike.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import {
  type BudgetStore,
  createPostgresBudgetStore,
  createSqliteBudgetStore,
  createUsageLog,
  type UsageCompletionsPage,
  type UsageCompletionsQuery,
  type UsageGroupBy,
  type UsageRecord,
  usageCompletions,
} from "../../src/budget/index.js";
import { ApiError } from "../../src/core/errors/index.js";
import { storesUnderTest } from "./helpers.js";

/** 2030-03-17T00:00:00Z, Unix seconds: a UTC midnight. */
const DAY0 = 1_899_936_000;
const KEYS = ["key_000000000001", "key_000000000002", "key_000000000003"];
const MODELS = ["m-small", "m-large"];

/** A deterministic spread of records over three days: keys and models mixed, seconds apart. */
function sampleRecords(): UsageRecord[] {
  const records: UsageRecord[] = [];
  for (let i = 0; i < 240; i++) {
    const at = DAY0 + ((i * 7919) % (3 * 86_400)); // pseudo-random over 3 days, to the second
    records.push({
      keyId: KEYS[i % 3] as string,
      model: MODELS[(i >> 1) % 2] as string,
      inputTokens: 1 + (i % 17),
      outputTokens: (i * 5) % 23,
      activationTokens: i % 4 === 0 ? 3 : 0,
      chargedTokens: 1 + (i % 17) + ((i * 5) % 23),
      status: i % 10 === 0 ? 499 : 200,
      requestId: `req-${i}`,
      createdAt: at * 1000 + (i % 1000),
    });
  }
  return records;
}

type Result = { key: string | null; model: string | null; input: number; output: number; n: number };

/** The buckets a query should give, summed in JavaScript from the records (the oracle). */
function expected(
  records: UsageRecord[],
  q: { startTime: number; endTime: number; w: number; groupBy: readonly UsageGroupBy[] },
): Map<number, Result[]> {
  const out = new Map<number, Map<string, Result>>();
  for (const r of records) {
    const s = r.createdAt / 1000;
    if (s < q.startTime || s >= q.endTime) continue;
    const bucket = Math.floor(s / q.w) * q.w;
    const key = q.groupBy.includes("api_key_id") ? r.keyId : null;
    const model = q.groupBy.includes("model") ? r.model : null;
    const groups = out.get(bucket) ?? new Map<string, Result>();
    out.set(bucket, groups);
    const g = groups.get(`${key}|${model}`) ?? { key, model, input: 0, output: 0, n: 0 };
    groups.set(`${key}|${model}`, g);
    g.input += r.inputTokens;
    g.output += r.outputTokens;
    g.n++;
  }
  const sorted = new Map<number, Result[]>();
  for (const [b, groups] of out) {
    sorted.set(
      b,
      [...groups.values()].sort((x, y) =>
        `${x.key}|${x.model}` < `${y.key}|${y.model}`
          ? -1
          : `${x.key}|${x.model}` > `${y.key}|${y.model}`
            ? 1
            : 0,
      ),
    );
  }
  return sorted;
}

/** A page's buckets reduced to the oracle's shape (empty buckets kept, keyed by their aligned start). */
function actual(page: UsageCompletionsPage, w: number): Map<number, Result[]> {
  const out = new Map<number, Result[]>();
  for (const b of page.data) {
    if (b.results.length === 0) continue;
    out.set(
      Math.floor(b.start_time / w) * w,
      b.results.map((r) => ({
        key: r.api_key_id,
        model: r.model,
        input: r.input_tokens,
        output: r.output_tokens,
        n: r.num_model_requests,
      })),
    );
  }
  return out;
}

/** Every page of a query, following next_page. */
async function allPages(store: BudgetStore, q: UsageCompletionsQuery): Promise<UsageCompletionsPage[]> {
  const pages: UsageCompletionsPage[] = [];
  let page: string | undefined;
  do {
    const p = await usageCompletions(store, { ...q, page }, (DAY0 + 10 * 86_400) * 1000);
    pages.push(p);
    page = p.next_page ?? undefined;
  } while (page !== undefined && pages.length < 100);
  return pages;
}

describe.each(storesUnderTest("usage_records"))("usage records on $kind", (under) => {
  let store: BudgetStore;
  const records = sampleRecords();
  beforeAll(() => under.setup());
  afterAll(() => under.teardown());
  beforeEach(async (ctx) => {
    await under.fresh(ctx);
    const o = under.options();
    store =
      "path" in o
        ? createSqliteBudgetStore({ path: o.path })
        : await createPostgresBudgetStore({ url: o.postgresUrl });
  });
  afterEach(async () => {
    await store?.close().catch(() => undefined);
    under.cleanup();
  });

  /** Writes the sample through a usage log in batches of 100 rows, as the gateway does. */
  const writeSample = async () => {
    let at = 0; // the log stamps created_at from its clock: the sample's own times
    const log = createUsageLog(store, { batchRows: 100, flushIntervalMs: 5, now: () => at });
    for (const r of records) {
      const { chargedTokens, createdAt, ...rest } = r;
      at = createdAt;
      log.record({ ...rest, settled: { outcome: "settled", chargedTokens }, usedTokens: 0, heldTokens: 0 });
    }
    await log.close();
    expect({ written: log.written, flushes: log.flushes, dropped: log.dropped }).toEqual({
      written: 240,
      flushes: 3,
      dropped: 0,
    });
  };

  it("a log's records are written in one INSERT per batch, each field as given", async () => {
    let t = 1_000;
    const log = createUsageLog(store, { flushIntervalMs: 5, now: () => t++ });
    log.record({
      keyId: KEYS[0] as string,
      model: "m-small",
      inputTokens: 5,
      outputTokens: 7,
      activationTokens: 11,
      status: 200,
      requestId: "req-a",
      settled: { outcome: "settled", chargedTokens: 23 },
      usedTokens: 23,
      heldTokens: 40,
    });
    log.record({
      keyId: KEYS[1] as string,
      model: "m-large",
      inputTokens: 3,
      outputTokens: 0,
      activationTokens: 0,
      status: 503,
      requestId: "req-b",
      settled: { outcome: "pending", chargedTokens: 0 }, // kept by the ledger: charged min(used, held) later
      usedTokens: 9,
      heldTokens: 4,
    });
    expect(log.queued).toBe(2);
    await log.flush();
    expect({ queued: log.queued, written: log.written, flushes: log.flushes }).toEqual({
      queued: 0,
      written: 2,
      flushes: 1,
    });
    const page = await usageCompletions(store, {
      startTime: 0,
      endTime: 60,
      bucketWidth: "1m",
      groupBy: ["api_key_id"],
    });
    expect(page.data).toHaveLength(1);
    expect(
      page.data[0]?.results.map((r) => [r.api_key_id, r.input_tokens, r.output_tokens, r.num_model_requests]),
    ).toEqual([
      [KEYS[0], 5, 7, 1],
      [KEYS[1], 3, 0, 1],
    ]);
    await log.close();
  });

  it("past its bound a log drops new records, counted and logged; a failed flush keeps its records", async () => {
    const problems: string[] = [];
    const log = createUsageLog(store, {
      maxQueued: 3,
      flushIntervalMs: 60_000,
      onProblem: (m) => problems.push(m),
    });
    const entry = (i: number) => ({
      keyId: KEYS[0] as string,
      model: "m-small",
      inputTokens: i,
      outputTokens: 0,
      activationTokens: 0,
      status: 200,
      requestId: `r${i}`,
      settled: undefined, // a settle that threw: charged 0
      usedTokens: i,
      heldTokens: i,
    });
    for (let i = 0; i < 5; i++) log.record(entry(i));
    expect({ queued: log.queued, dropped: log.dropped }).toEqual({ queued: 3, dropped: 2 });
    await store.close(); // the store cannot write: the flush fails, its records stay queued
    await log.flush();
    expect({ queued: log.queued, written: log.written }).toEqual({ queued: 3, written: 0 });
    expect(problems[0]).toMatch(/2 records dropped \(queue full at 3; 2 in all\)/);
    expect(problems[1]).toMatch(/a flush of 3 records failed; kept, tried again/);
    await log.close(); // still failing: what is left is reported lost
    expect(log.dropped).toBe(5);
    expect(problems.at(-1)).toMatch(/3 records could not be written before the close; lost/);
  });

  it.each([
    { width: "1m" as const, w: 60, groupBy: [] as UsageGroupBy[] },
    { width: "1h" as const, w: 3600, groupBy: ["api_key_id"] as UsageGroupBy[] },
    { width: "1h" as const, w: 3600, groupBy: ["model"] as UsageGroupBy[] },
    { width: "1d" as const, w: 86_400, groupBy: ["api_key_id", "model"] as UsageGroupBy[] },
    { width: "1d" as const, w: 86_400, groupBy: [] as UsageGroupBy[] },
  ])(
    "buckets of $width grouped by $groupBy equal the sums of their rows, over every page",
    async ({ width, w, groupBy }) => {
      await writeSample();
      // Bounds inside buckets, so that the first and last bucket are partial.
      const startTime = DAY0 + 3 * 3600 + 17 * 60 + 5;
      const endTime = DAY0 + 2 * 86_400 + 5 * 3600 + 41;
      const limit = { "1m": 600, "1h": 7, "1d": 2 }[width];
      const pages = await allPages(store, { startTime, endTime, bucketWidth: width, groupBy, limit });
      const buckets = pages.flatMap((p) => p.data);
      // Every bucket of the range, empty ones too, aligned to UTC and clipped to the bounds.
      const first = Math.floor(startTime / w) * w;
      expect(buckets).toHaveLength(Math.ceil((endTime - first) / w));
      expect(buckets[0]?.start_time).toBe(startTime);
      expect(buckets.at(-1)?.end_time).toBe(endTime);
      for (const [i, b] of buckets.entries()) {
        if (i > 0) expect(b.start_time).toBe(first + i * w);
        if (i < buckets.length - 1) expect(b.end_time).toBe(first + (i + 1) * w);
      }
      expect(pages.slice(0, -1).every((p) => p.has_more && p.data.length === limit)).toBe(true);
      expect(pages.at(-1)?.has_more).toBe(false);
      expect(pages.at(-1)?.next_page).toBeNull();
      const merged = new Map<number, Result[]>();
      for (const p of pages) for (const [b, r] of actual(p, w)) merged.set(b, r);
      expect(merged).toEqual(expected(records, { startTime, endTime, w, groupBy }));
      const total = [...merged.values()].flat().reduce((s, r) => s + r.n, 0);
      expect(total).toBe(
        records.filter((r) => r.createdAt >= startTime * 1000 && r.createdAt < endTime * 1000).length,
      );
      expect(total).toBeGreaterThan(100);
    },
  );

  it("filters by key and model; a result names only what it is grouped by", async () => {
    await writeSample();
    const page = await usageCompletions(store, {
      startTime: DAY0,
      endTime: DAY0 + 3 * 86_400,
      bucketWidth: "1d",
      groupBy: ["model"],
      apiKeyIds: [KEYS[1] as string],
      models: ["m-large"],
    });
    const want = records.filter((r) => r.keyId === KEYS[1] && r.model === "m-large");
    expect(page.data).toHaveLength(3);
    const results = page.data.flatMap((b) => b.results);
    expect(results.every((r) => r.model === "m-large" && r.api_key_id === null)).toBe(true);
    expect(results.reduce((s, r) => s + r.num_model_requests, 0)).toBe(want.length);
    expect(results.reduce((s, r) => s + r.input_tokens, 0)).toBe(want.reduce((s, r) => s + r.inputTokens, 0));
    expect(results[0]).toMatchObject({
      object: "organization.usage.completions.result",
      input_cached_tokens: 0,
      project_id: null,
      batch: null,
    });
  });

  it("OpenAI's defaults and maxima of limit per width; a bad value is a 400 naming its parameter", async () => {
    const now = (DAY0 + 40 * 86_400) * 1000;
    const page = (q: Partial<UsageCompletionsQuery>) =>
      usageCompletions(store, { startTime: DAY0, ...q }, now);
    expect((await page({})).data).toHaveLength(7); // 1d: 7 buckets by default, end_time = now
    expect((await page({ bucketWidth: "1h" })).data).toHaveLength(24);
    expect((await page({ bucketWidth: "1m" })).data).toHaveLength(60);
    expect((await page({ limit: 31 })).data).toHaveLength(31);
    expect((await page({ limit: 31 })).has_more).toBe(true);
    const refusal = async (q: Partial<UsageCompletionsQuery>) => {
      try {
        await page(q);
      } catch (err) {
        expect(err).toBeInstanceOf(ApiError);
        return [(err as ApiError).status, (err as ApiError).param];
      }
      return "accepted";
    };
    expect(await refusal({ limit: 32 })).toEqual([400, "limit"]);
    expect(await refusal({ bucketWidth: "1h", limit: 169 })).toEqual([400, "limit"]);
    expect(await refusal({ bucketWidth: "1m", limit: 1441 })).toEqual([400, "limit"]);
    expect(await refusal({ bucketWidth: "1m", limit: 1440 })).toBe("accepted");
    expect(await refusal({ limit: 0 })).toEqual([400, "limit"]);
    expect(await refusal({ endTime: DAY0 })).toEqual([400, "end_time"]);
    expect(await refusal({ startTime: -1 })).toEqual([400, "start_time"]);
    expect(await refusal({ page: "page_bm9wZQ" })).toEqual([400, "page"]);
    expect(await refusal({ page: `page_${Buffer.from(String(DAY0 + 3600)).toString("base64url")}` })).toEqual(
      [400, "page"],
    ); // not a bucket start of 1d
  });
});
