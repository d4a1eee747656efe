// The client against the reference engine (src/engine: vLLM's HTTP contract on loopback).
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema, FinishReason } from "../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../src/core/errors/index.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import {
  buildVllmRequest,
  createVllmClient,
  newUpstreamRequestId,
  TextOffsets,
  toCompletionResponse,
  toStreamChunk,
  type VllmClient,
} from "../../src/upstream/index.js";
import { configDefaults } from "../helpers/config-defaults.js";

/** The Inference clients' silence bound: the configuration's default (ACS_UPSTREAM_HEADERS_TIMEOUT_MS). */
const silenceTimeoutMs = configDefaults.upstreamHeadersTimeoutMs;

let engine: RunningEngine;
let client: VllmClient;
beforeAll(async () => {
  engine = await startEngine({ preset: "tiny" });
  client = createVllmClient({ baseUrl: engine.url, silenceTimeoutMs });
});
afterAll(async () => {
  await client?.close();
  await engine?.close();
});

const opts = () => ({
  signal: new AbortController().signal,
  deadlineMs: 20_000,
  upstreamRequestId: newUpstreamRequestId(),
});
type Init = Parameters<typeof create<typeof CreateCompletionRequestSchema>>[1];
const request = (init: Init) => create(CreateCompletionRequestSchema, { model: "tiny", ...init });
const resolved = (stream: boolean, maxTokens = 8) => ({
  servedModelName: engine.model.id,
  maxTokens,
  stream,
  vllmXargs: {},
});

describe("against the reference engine", () => {
  it("lists the served model and tokenizes like the engine", async () => {
    const list = await client.listModels();
    expect(list.data.map((m) => m.id)).toContain(engine.model.id);
    const t = await client.tokenize(engine.model.id, "Four score and seven", true);
    expect(t.tokens).toStrictEqual(engine.model.tokenize("Four score and seven", true));
    expect(t.maxModelLen).toBe(engine.model.maxModelLen);
    expect(await client.health()).toBe(true);
  });

  it("a greedy completion equals the same stream collected; logprobs, echo and token ids convert", async () => {
    const req = request({
      prompt: { case: "text", value: "Four score" },
      temperature: 0,
      logprobs: 2,
      returnTokenIds: true,
      seed: 9223372036854775807n,
    });
    const whole = toCompletionResponse(
      await client.complete(buildVllmRequest(req, resolved(false)), opts()),
      "tiny",
    );
    const choice = whole.choices[0];
    expect(choice?.finishReason).not.toBe(FinishReason.UNSPECIFIED);
    expect(choice?.logprobs?.content.length).toBe(choice?.tokenIds.length);
    expect(choice?.promptTokenIds).toStrictEqual(engine.model.tokenize("Four score", true));
    expect(whole.usage?.completionTokens).toBe(choice?.tokenIds.length);

    const ids = { id: "cmpl-x", created: 1n, model: "tiny" };
    let text = "";
    let usage: number | undefined;
    const offsets = new TextOffsets();
    for await (const c of client.stream(buildVllmRequest(req, resolved(true)), opts())) {
      const s = toStreamChunk(c, ids, offsets);
      text += s.choices.map((x) => x.text).join("");
      if (s.usage !== undefined) usage = s.usage.totalTokens;
    }
    expect(text).toBe(choice?.text);
    expect(usage).toBe(whole.usage?.totalTokens);
  });

  it("prompt_logprobs and echo convert (first position empty, first echoed token without logprob)", async () => {
    const req = request({
      prompt: { case: "text", value: "Four score" },
      temperature: 0,
      promptLogprobs: 1,
      echo: true,
      logprobs: 1,
    });
    const r = toCompletionResponse(
      await client.complete(buildVllmRequest(req, resolved(false, 2)), opts()),
      "tiny",
    );
    const c = r.choices[0];
    expect(c?.promptLogprobs[0]?.values).toStrictEqual([]);
    expect(c?.promptLogprobs.length).toBe(engine.model.tokenize("Four score", true).length);
    expect(c?.logprobs?.content[0]?.logprob).toBeUndefined();
    expect(c?.text.startsWith("Four score")).toBe(true);
  });

  it("Inference's own 400s pass on: out-of-vocabulary (non-stream and in-band) and prompt too long", async () => {
    const oov = request({ prompt: { case: "tokenIds", value: { values: [1, 10_000_000] } } });
    const e1 = await client.complete(buildVllmRequest(oov, resolved(false)), opts()).catch((e: unknown) => e);
    expect(e1).toBeInstanceOf(ApiError);
    expect((e1 as ApiError).code).toBe("invalid_request");
    const e2 = await (async () => {
      for await (const _ of client.stream(buildVllmRequest(oov, resolved(true)), opts())) {
        /* drain */
      }
    })().catch((e: unknown) => e);
    expect((e2 as ApiError).code).toBe("invalid_request");
    // The same param either way (the in-band error names none).
    expect([(e1 as ApiError).param, (e2 as ApiError).param]).toEqual(["prompt", "prompt"]);

    const long = request({
      prompt: { case: "tokenIds", value: { values: Array(engine.model.maxModelLen).fill(1) } },
    });
    const e3 = await client
      .complete(buildVllmRequest(long, resolved(false)), opts())
      .catch((e: unknown) => e);
    expect([(e3 as ApiError).code, (e3 as ApiError).param]).toStrictEqual([
      "context_length_exceeded",
      "prompt",
    ]);
  });

  it("a consumer that stops early aborts the engine request before it is done", async () => {
    const upstreamRequestId = newUpstreamRequestId();
    // the engine ends each request with "abort" or "finish" (run to max_tokens)
    const ended = new Promise<string>((resolve) => {
      engine.events.once("abort", (id: string) => resolve(`abort ${id}`));
      engine.events.once("finish", (id: string) => resolve(`finish ${id}`));
    });
    const maxTokens = engine.model.maxModelLen - engine.model.tokenize("Four").length;
    const req = request({ prompt: { case: "text", value: "Four" }, ignoreEos: true });
    for await (const _ of client.stream(buildVllmRequest(req, resolved(true, maxTokens)), {
      signal: new AbortController().signal,
      upstreamRequestId,
    })) {
      break;
    }
    expect(await ended).toBe(`abort cmpl-${upstreamRequestId}`);
  });
});
