// Counting prompts: identical texts once, at most MAX_CONCURRENT_TOKENIZE /tokenize calls at a time.
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { countPromptTokens, MAX_CONCURRENT_TOKENIZE } from "../../src/service/count-prompt-tokens.js";
import { createVllmClient, type VllmClient } from "../../src/upstream/index.js";
import { configDefaults } from "../helpers/config-defaults.js";
import { type FakeUpstream, startFakeUpstream } from "../upstream/fake-upstream.js";

/** The Inference clients' silence bound: the configuration's default (ACS_UPSTREAM_HEADERS_TIMEOUT_MS). */
const silenceTimeoutMs = configDefaults.upstreamHeadersTimeoutMs;

let upstream: FakeUpstream;
let client: VllmClient;
let inFlight = 0;
let mostInFlight = 0;

beforeAll(async () => {
  upstream = await startFakeUpstream(async (_req, res, body) => {
    inFlight++;
    mostInFlight = Math.max(mostInFlight, inFlight);
    await new Promise((r) => setTimeout(r, 5));
    inFlight--;
    const { prompt } = JSON.parse(body) as { prompt: string };
    res.setHeader("content-type", "application/json");
    // One token per character, plus BOS.
    const tokens = Array.from({ length: prompt.length + 1 }, (_, i) => i);
    res.end(JSON.stringify({ count: tokens.length, max_model_len: 512, tokens }));
  });
  client = createVllmClient({ baseUrl: upstream.url, silenceTimeoutMs });
});
afterAll(async () => {
  await client.close();
  await upstream.close();
});

const texts = (values: string[]) =>
  create(CreateCompletionRequestSchema, { model: "m", prompt: { case: "texts", value: { values } } });

describe("countPromptTokens", () => {
  it("counts token-id prompts by their length, without Inference", async () => {
    const before = upstream.requests.length;
    const request = create(CreateCompletionRequestSchema, {
      model: "m",
      prompt: { case: "tokenIdsList", value: { values: [{ values: [1, 2, 3] }, { values: [4] }] } },
    });
    expect(await countPromptTokens(client, "m", request, new AbortController().signal)).toEqual([3, 1]);
    expect(upstream.requests.length).toBe(before);
  });

  it("asks Inference once per distinct text, in the request's order", async () => {
    const before = upstream.requests.length;
    const prompts = ["aa", "b", "aa", "ccc", "b", "aa"];
    expect(await countPromptTokens(client, "m", texts(prompts), new AbortController().signal)).toEqual([
      3, 2, 3, 4, 2, 3,
    ]);
    expect(
      upstream.requests
        .slice(before)
        .map((r) => (JSON.parse(r.body) as { prompt: string }).prompt)
        .sort(),
    ).toEqual(["aa", "b", "ccc"]);
  });

  it(`has at most ${MAX_CONCURRENT_TOKENIZE} /tokenize calls in flight for 200 distinct texts`, async () => {
    mostInFlight = 0;
    const before = upstream.requests.length;
    const prompts = Array.from({ length: 200 }, (_, i) => `prompt number ${i}`);
    const counts = await countPromptTokens(client, "m", texts(prompts), new AbortController().signal);
    expect(counts).toEqual(prompts.map((p) => p.length + 1));
    expect(upstream.requests.length - before).toBe(200);
    expect(mostInFlight).toBeGreaterThan(1);
    expect(mostInFlight).toBeLessThanOrEqual(MAX_CONCURRENT_TOKENIZE);
  });
});
