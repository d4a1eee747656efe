// Arbitrary JSON bodies against the real gateway and engine: every answer is a response with a
// known status and a well-formed body — never a 500, a crash or a hang.
import fc from "fast-check";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { completionRequestFieldNames } from "../../src/surfaces/rest/decode-completion-request.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

const smallInt = fc.integer({ min: -3, max: 40 });
const value = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  smallInt,
  fc.double({ min: -3, max: 3, noNaN: true }),
  fc.string({ maxLength: 8 }),
  fc.array(smallInt, { maxLength: 4 }),
  fc.array(fc.string({ maxLength: 4 }), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 6 }), fc.oneof(fc.boolean(), smallInt), { maxKeys: 2 }),
  fc.array(fc.array(fc.double({ min: -1, max: 1, noNaN: true }), { minLength: 64, maxLength: 64 }), {
    maxLength: 1,
  }),
);
const body = fc.record(
  {
    model: fc.constantFrom("tiny", "acs/tiny", "nope", 3),
    prompt: fc.oneof(fc.string({ maxLength: 12 }), fc.array(smallInt, { maxLength: 6 }), value),
    max_tokens: fc.oneof(fc.integer({ min: -1, max: 8 }), value),
    extra: fc.dictionary(fc.constantFrom(...completionRequestFieldNames, "best_of", "zzz"), value, {
      maxKeys: 4,
    }),
  },
  { requiredKeys: [] },
);

describe("arbitrary bodies", () => {
  it("always get a known status and a well-formed body", async () => {
    await fc.assert(
      fc.asyncProperty(body, async ({ extra, ...fields }) => {
        const json = { ...extra, ...fields };
        const res = await checkedFetch(`${stack.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(json),
        });
        const text = await res.text();
        expect([200, 400, 404]).toContain(res.status);
        expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
        if (res.status !== 200) {
          const envelope = JSON.parse(text) as { error: Record<string, unknown>; request_id: string };
          expect(Object.keys(envelope.error).sort()).toEqual(["code", "message", "param", "type"]);
        } else if ((res.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
          const chunks = sseChunks(text);
          for (const c of chunks) expect(c).not.toHaveProperty("error");
        } else {
          expect(JSON.parse(text)).toMatchObject({ object: "text_completion" });
        }
      }),
      { numRuns: 150 },
    );
    // and the server is still healthy
    expect((await checkedFetch(`${stack.url}/healthz`)).status).toBe(200);
  });
});
