/** Property: any JSON body to POST /v1/completions gets a well-formed response — never a crash or a hang. */
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { parseSse } from "./helpers.js";

let engine: RunningEngine;
beforeAll(async () => {
  engine = await startEngine({ preset: "tiny", maxModelLen: 128 });
});
afterAll(async () => {
  await engine.close();
});

const anyValue = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  fc.constantFrom(null, true, false, 0, -1, 1.5, "", "x", [], {}),
);
const plausible = fc.record(
  {
    model: fc.oneof(fc.constant("acs/tiny"), anyValue),
    prompt: fc.oneof(
      fc.string({ maxLength: 20 }),
      fc.array(fc.string({ maxLength: 5 }), { maxLength: 3 }),
      fc.array(fc.integer({ min: -2, max: 300 }), { maxLength: 5 }),
      fc.array(fc.array(fc.integer({ min: 0, max: 257 }), { maxLength: 3 }), { maxLength: 3 }),
      anyValue,
    ),
    max_tokens: fc.oneof(fc.integer({ min: -2, max: 140 }), anyValue),
    n: fc.oneof(fc.integer({ min: -1, max: 3 }), anyValue),
    temperature: fc.oneof(fc.double({ min: -1, max: 3, noNaN: true }), anyValue),
    top_p: fc.oneof(fc.double({ min: -0.5, max: 1.5, noNaN: true }), anyValue),
    top_k: fc.oneof(fc.integer({ min: -3, max: 300 }), anyValue),
    min_p: fc.oneof(fc.double({ min: -0.5, max: 1.5, noNaN: true }), anyValue),
    stop: fc.oneof(
      fc.string({ maxLength: 3 }),
      fc.array(fc.string({ maxLength: 3 }), { maxLength: 3 }),
      anyValue,
    ),
    stream: fc.oneof(fc.boolean(), anyValue),
    stream_options: fc.oneof(fc.record({ include_usage: fc.boolean() }), anyValue),
    logprobs: fc.oneof(fc.integer({ min: -1, max: 25 }), anyValue),
    prompt_logprobs: fc.oneof(fc.integer({ min: -1, max: 25 }), anyValue),
    echo: fc.oneof(fc.boolean(), anyValue),
    seed: fc.oneof(fc.integer(), anyValue),
    min_tokens: fc.oneof(fc.integer({ min: -1, max: 10 }), anyValue),
    stop_token_ids: fc.oneof(fc.array(fc.integer({ min: -1, max: 300 }), { maxLength: 3 }), anyValue),
    bad_words: fc.oneof(fc.array(fc.string({ maxLength: 3 }), { maxLength: 3 }), anyValue),
    repetition_penalty: fc.oneof(fc.double({ min: -1, max: 3, noNaN: true }), anyValue),
    logit_bias: fc.oneof(fc.dictionary(fc.string({ maxLength: 3 }), fc.double({ noNaN: true })), anyValue),
    vllm_xargs: fc.oneof(
      fc.record({
        output_residual_stream: fc.oneof(fc.constant("[0, 2]"), fc.constant("true"), anyValue),
        apply_steering_vectors: fc.oneof(
          fc.constant(JSON.stringify([{ activations: [[1, 2]], layer_indices: [0] }])),
          fc.constant("[{"),
          anyValue,
        ),
      }),
      anyValue,
    ),
  },
  { requiredKeys: [] },
);
const body = fc.oneof(plausible, anyValue);

async function send(payload: string): Promise<{ status: number; text: string; type: string }> {
  const r = await fetch(`${engine.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: payload,
  });
  return { status: r.status, text: await r.text(), type: r.headers.get("content-type") ?? "" };
}

describe("property: any JSON body → a response", () => {
  it("never crashes or hangs; errors use vLLM's envelope; streams end with [DONE]", async () => {
    await fc.assert(
      fc.asyncProperty(body, async (b) => {
        const r = await send(JSON.stringify(b) ?? "null");
        expect([200, 400, 404]).toContain(r.status);
        if (r.type.startsWith("text/event-stream")) {
          const events = parseSse(r.text);
          expect(events.at(-1)?.data).toBe("[DONE]");
        } else {
          const json = JSON.parse(r.text) as Record<string, unknown>;
          if (r.status !== 200) {
            const err = json.error as Record<string, unknown>;
            expect(typeof err.message).toBe("string");
            expect(err.code).toBe(r.status);
          } else expect(json.object).toBe("text_completion");
        }
      }),
      { numRuns: 300 },
    );
    // the server is still alive
    expect((await fetch(`${engine.url}/health`)).status).toBe(200);
  });

  it("malformed JSON gets a 400 envelope", async () => {
    const r = await send("{not json");
    expect(r.status).toBe(400);
    expect((JSON.parse(r.text) as { error: { code: number } }).error.code).toBe(400);
  });
});
