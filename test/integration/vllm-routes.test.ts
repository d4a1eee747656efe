// vLLM's own routes a vLLM user calls — GET /health, GET /version, POST /tokenize and
// POST /detokenize — through the real gateway (keys on, SQLite) and the reference engine: vLLM's
// shapes, a tokenize → detokenize round trip, and refusals in the same envelopes as completions'.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
let dir: string;
let key: string;
/** A key that may use another model only. */
let otherKey: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-vllm-routes-"));
  stack = await startStack({ dbPath: join(dir, "acs.db") });
  if (stack.ledger === undefined) throw new Error("no ledger");
  key = (await stack.ledger.createKey({ budgetTokens: 100_000 })).key;
  otherKey = (await stack.ledger.createKey({ budgetTokens: 100_000, models: ["some/other-model"] })).key;
});
afterAll(async () => {
  await stack?.close();
  rmSync(dir, { recursive: true, force: true });
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

async function post(
  path: string,
  body: unknown,
  /** null: no Authorization header. */
  authorization: string | null = `Bearer ${key}`,
): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await checkedFetch(`${stack.url}${path}`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(authorization === null ? {} : { authorization }),
    },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

/** An answer without its request id (each call has its own). */
const withoutId = ({ status, json }: { status: number; json: Record<string, unknown> }) => {
  const { request_id, ...rest } = json;
  expect(request_id).toMatch(/^req_[0-9a-f]{32}$/);
  return { status, ...rest };
};

const completion = (fields: Record<string, unknown>) =>
  ({ model: "tiny", prompt: "Hi", max_tokens: 1, ...fields }) as Record<string, unknown>;

describe("GET /health and GET /version", () => {
  it("/health answers 200 with an empty body while the gateway is ready (as /readyz), without a key", async () => {
    const res = await checkedFetch(`${stack.url}/health`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("");
    expect((await checkedFetch(`${stack.url}/readyz`)).status).toBe(200);
  });

  it("/version answers vLLM's {version} with the gateway's package.json version", async () => {
    const pkg = JSON.parse(readFileSync(join(import.meta.dirname, "../../package.json"), "utf8")) as {
      version: string;
    };
    const res = await checkedFetch(`${stack.url}/version`);
    expect(res.status).toBe(200);
    expect(await res.json()).toStrictEqual({ version: pkg.version });
  });
});

describe("POST /tokenize and POST /detokenize", () => {
  it("/tokenize answers vLLM's shape with the engine's tokens; token_strs only when asked", async () => {
    const engine = stack.engine as RunningEngine;
    const plain = await post("/tokenize", { model: "tiny", prompt: "The sky is" });
    expect(plain.status).toBe(200);
    const tokens = engine.model.tokenize("The sky is", true);
    expect(plain.json).toStrictEqual({
      count: tokens.length,
      max_model_len: engine.model.maxModelLen,
      tokens,
      token_strs: null,
    });
    const bare = await post("/tokenize", {
      model: stack.modelId,
      prompt: "The sky is",
      add_special_tokens: false,
    });
    expect(bare.json.tokens).toStrictEqual(engine.model.tokenize("The sky is", false));
    const strs = await post("/tokenize", { model: "tiny", prompt: "The sky is", return_token_strs: true });
    expect(strs.json.token_strs).toHaveLength(tokens.length);
  });

  it("tokenize → detokenize gives the text back", async () => {
    const text = "The sky is blue, and the sea is too.";
    const tokenized = await post("/tokenize", { model: "tiny", prompt: text, add_special_tokens: false });
    const detokenized = await post("/detokenize", { model: "tiny", tokens: tokenized.json.tokens });
    expect(detokenized).toStrictEqual({ status: 200, json: { prompt: text } });
  });

  it("the same calls over Connect (acs.v1.CompletionsService/Tokenize, /Detokenize)", async () => {
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const headers = { authorization: `Bearer ${key}` };
    const rest = await post("/tokenize", { model: "tiny", prompt: "Hi there", add_special_tokens: false });
    const tokenized = await client.tokenize(
      { model: "tiny", prompt: "Hi there", addSpecialTokens: false },
      { headers },
    );
    expect(tokenized.tokens).toStrictEqual(rest.json.tokens);
    expect((await client.detokenize({ model: "tiny", tokens: tokenized.tokens }, { headers })).prompt).toBe(
      "Hi there",
    );
  });
});

describe("refusals: the envelopes of POST /v1/completions", () => {
  const routes = [
    ["/tokenize", { model: "tiny", prompt: "Hi" }],
    ["/detokenize", { model: "tiny", tokens: [1, 2] }],
  ] as const;

  it.each(routes)("%s: no key and a bad key are 401, as a completion", async (path, body) => {
    for (const authorization of [null, "Bearer acs-not-a-key"]) {
      const got = withoutId(await post(path, body, authorization));
      expect(got.status).toBe(401);
      expect(got).toStrictEqual(withoutId(await post("/v1/completions", completion({}), authorization)));
    }
  });

  it.each(routes)("%s: a model the key may not use is 403, as a completion", async (path, body) => {
    const got = withoutId(await post(path, body, `Bearer ${otherKey}`));
    expect(got).toMatchObject({ status: 403, error: { code: "model_not_allowed", param: "model" } });
    expect(got).toStrictEqual(withoutId(await post("/v1/completions", completion({}), `Bearer ${otherKey}`)));
  });

  it.each(routes)("%s: an unknown model is 404, as a completion", async (path, body) => {
    const got = withoutId(await post(path, { ...body, model: "no/such-model" }));
    expect(got).toMatchObject({ status: 404, error: { code: "model_not_found" } });
    expect(got).toStrictEqual(
      withoutId(await post("/v1/completions", completion({ model: "no/such-model" }))),
    );
  });

  it.each(routes)("%s: an unknown field is 400 with its param, as a completion", async (path, body) => {
    const got = withoutId(await post(path, { ...body, best_of: 2 }));
    expect(got).toMatchObject({ status: 400, error: { code: "invalid_request", param: "best_of" } });
    expect(got).toStrictEqual(withoutId(await post("/v1/completions", completion({ best_of: 2 }))));
  });

  it.each(routes)(
    "%s: a missing model, a wrong type, malformed JSON are 400, as a completion",
    async (path, body) => {
      const { model: _model, ...noModel } = body;
      const { model: _m, prompt: _p, ...noModelCompletion } = completion({});
      const missing = withoutId(await post(path, noModel));
      expect(missing).toMatchObject({ status: 400, error: { param: "model" } });
      expect(missing).toStrictEqual(
        withoutId(await post("/v1/completions", { ...noModelCompletion, prompt: "Hi" })),
      );
      const wrongType = withoutId(await post(path, { ...body, model: 5 }));
      expect(wrongType).toMatchObject({ status: 400, error: { param: "model" } });
      expect(wrongType).toStrictEqual(withoutId(await post("/v1/completions", completion({ model: 5 }))));
      expect(withoutId(await post(path, "{"))).toStrictEqual(withoutId(await post("/v1/completions", "{")));
    },
  );

  it("field rules of their own: prompt must be a string, tokens integers ≥ 0 and at least one", async () => {
    expect(withoutId(await post("/tokenize", { model: "tiny", prompt: ["a"] }))).toMatchObject({
      status: 400,
      error: { param: "prompt", message: "Invalid type for 'prompt': expected a string." },
    });
    expect(withoutId(await post("/tokenize", { model: "tiny" }))).toMatchObject({
      status: 400,
      error: { param: "prompt", message: "You must provide a prompt." },
    });
    for (const tokens of [[-1], [], "1", [1.5]]) {
      expect(withoutId(await post("/detokenize", { model: "tiny", tokens }))).toMatchObject({
        status: 400,
        error: { code: "invalid_request", param: "tokens" },
      });
    }
    // An id outside the vocabulary: Inference's refusal, in the envelope.
    expect(withoutId(await post("/detokenize", { model: "tiny", tokens: [10_000_000] }))).toMatchObject({
      status: 400,
      error: { type: "invalid_request_error", param: "tokens" },
    });
  });
});

describe("a replica that refuses: the call goes to another", () => {
  let engine: RunningEngine;
  let refusing: Server;
  let replicated: Stack;
  const refused: string[] = [];

  beforeAll(async () => {
    engine = await startEngine({ preset: "tiny" });
    // Passes the pool's checks (/health, /v1/models), answers every other call 503.
    refusing = createServer((req, res) => {
      if (req.url === "/health") return void res.end();
      if (req.url === "/v1/models") {
        void fetch(`${engine.url}/v1/models`)
          .then((r) => r.text())
          .then((text) => res.setHeader("content-type", "application/json").end(text));
        return;
      }
      refused.push(req.url ?? "");
      res.statusCode = 503;
      res.setHeader("content-type", "application/json");
      res.end(
        JSON.stringify({
          error: { message: "busy", type: "ServiceUnavailableError", param: null, code: 503 },
        }),
      );
    });
    await new Promise<void>((resolve) => refusing.listen(0, "127.0.0.1", resolve));
    const port = (refusing.address() as AddressInfo).port;
    replicated = await startStack({
      upstreams: [{ url: `http://127.0.0.1:${port}` }, { url: engine.url }],
      model: { id: engine.model.id, servedModelName: engine.model.id, maxModelLen: engine.model.maxModelLen },
    });
  });
  afterAll(async () => {
    await replicated?.close();
    await engine?.close();
    await new Promise((resolve) => refusing?.close(resolve));
  });

  it("every /tokenize and /detokenize is answered, though one replica answers 503", async () => {
    for (let k = 0; k < 4; k++) {
      const call = async (path: string, body: unknown) => {
        const res = await checkedFetch(`${replicated.url}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        expect(res.status).toBe(200);
        return (await res.json()) as Record<string, unknown>;
      };
      const { tokens } = await call("/tokenize", {
        model: "tiny",
        prompt: `Hi ${k}`,
        add_special_tokens: false,
      });
      expect(await call("/detokenize", { model: "tiny", tokens })).toStrictEqual({ prompt: `Hi ${k}` });
    }
    expect(refused.some((url) => url === "/tokenize")).toBe(true);
    expect(refused.some((url) => url === "/detokenize")).toBe(true);
  });
});
