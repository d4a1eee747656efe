import fc from "fast-check";
import Fastify from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isRequestId } from "../../../src/core/errors/index.js";
import { completionRequestFieldNames } from "../../../src/surfaces/rest/decode-completion-request.js";
import { restRoutes } from "../../../src/surfaces/rest/rest-routes.js";
import { configDefaults } from "../../helpers/config-defaults.js";
import { createFakeApi } from "./helpers/fake-api.js";

const app = Fastify();

beforeAll(async () => {
  await app.register(restRoutes, {
    api: createFakeApi().api,
    keepaliveIntervalMs: configDefaults.keepaliveIntervalMs,
    streamStallMs: configDefaults.streamStallMs,
  });
  await app.ready();
});
afterAll(async () => {
  await app.close();
});

const body = fc.oneof(
  fc.string({ maxLength: 100 }),
  fc.jsonValue().map((v) => JSON.stringify(v)),
  fc
    .dictionary(fc.constantFrom(...completionRequestFieldNames, "best_of", "__proto__"), fc.jsonValue(), {
      maxKeys: 6,
    })
    .map((fields) => JSON.stringify({ model: "llama-8b", prompt: "x", ...fields })),
);

describe("POST /v1/completions with arbitrary bodies (real lens codec, canned service)", () => {
  it("always answers: 200 with a completion or SSE, or a 4xx envelope — never a 500", async () => {
    await fc.assert(
      fc.asyncProperty(body, async (payload) => {
        const res = await app.inject({
          method: "POST",
          url: "/v1/completions",
          headers: { "content-type": "application/json" },
          payload,
        });
        expect(isRequestId(String(res.headers["x-request-id"]))).toBe(true);
        if (res.statusCode === 200) return;
        expect(res.statusCode).toBeGreaterThanOrEqual(400);
        expect(res.statusCode).toBeLessThan(500);
        const envelope = res.json() as { error: Record<string, unknown>; request_id: string };
        expect(Object.keys(envelope.error).sort()).toEqual(["code", "message", "param", "type"]);
        expect(envelope.request_id).toBe(res.headers["x-request-id"]);
      }),
      { numRuns: 400 },
    );
  });
});
