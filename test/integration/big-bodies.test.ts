// No body stalls the gateway: the shapes that made the old number reading quadratic get their
// envelope at once, and while a max-size body (≈7.5 MB, under the 8 MiB cap) is decoded, other
// callers are served. No clock is read: the test counts the /healthz answers that arrive while
// the big body is being decoded. To know that decoding has begun, the body is sent whole but for
// its last byte (the server cannot start before it), the server is given the turns to read all
// of it, and the last byte goes out together with the first poll.
import http from "node:http";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
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

interface Answer {
  status: number;
  requestId: string | undefined;
  json: {
    error: { message: string; type: string; param: string | null; code: string | null };
    request_id: string;
  };
}

/** A POST whose body goes out but for its last byte; `release()` sends it. */
async function postHoldingLastByte(
  path: string,
  body: Buffer,
): Promise<{ release(): void; answer: Promise<Answer> }> {
  const req = http.request(`${stack.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "content-length": body.length },
  });
  const answer = new Promise<Answer>((resolve, reject) => {
    req.on("error", reject);
    req.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("error", reject);
      res.on("end", () => {
        resolve({
          status: res.statusCode ?? 0,
          requestId: res.headers["x-request-id"] as string | undefined,
          json: JSON.parse(Buffer.concat(chunks).toString()) as Answer["json"],
        });
      });
    });
  });
  await new Promise<void>((resolve, reject) =>
    req.write(body.subarray(0, body.length - 1), (err) => (err ? reject(err) : resolve())),
  );
  return { release: () => req.end(body.subarray(body.length - 1)), answer };
}

async function healthz(): Promise<void> {
  // Plain fetch: this counts answers served meanwhile, nothing more.
  const res = await fetch(`${stack.url}/healthz`);
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

/**
 * Sends `body` to POST /v1/completions and counts the /healthz answers that arrive after its last
 * byte went out and before its own answer: the answers served while it was decoded.
 */
async function answersWhileDecoding(body: Buffer): Promise<{ answer: Answer; served: number }> {
  const big = await postHoldingLastByte("/v1/completions", body);
  // Every poll takes the server at least one turn of its event loop, in which it reads what the
  // socket holds: after these, it has read the whole body but for the byte it waits for.
  for (let i = 0; i < 20; i++) await healthz();
  let decoded = false;
  let served = 0;
  const polling = (async () => {
    while (!decoded) {
      await healthz();
      if (!decoded) served++;
    }
  })();
  big.release();
  const answer = await big.answer;
  decoded = true;
  await polling;
  return { answer, served };
}

function expectEnvelope(answer: Answer, param: string, message: string | RegExp): void {
  expect(answer.status).toBe(400);
  expect(answer.json.error).toMatchObject({ type: "invalid_request_error", code: "invalid_request", param });
  expect(answer.json.error.message).toMatch(message);
  expect(answer.json.request_id).toBe(answer.requestId);
}

const MAX_BODY = 7.5e6;
const int32Message = (param: string) =>
  `Invalid value for '${param}': expected an integer from -2147483648 to 2147483647 (int32).`;
const zeros = "0".repeat(100_000);

describe("number shapes that were quadratic get their envelope", () => {
  it.each([
    ["max_tokens", `{"model": "tiny", "prompt": "Hi", "max_tokens": 1${zeros}1}`, int32Message("max_tokens")],
    [
      "max_tokens",
      `{"model": "tiny", "prompt": "Hi", "max_tokens": 1.${zeros}1}`,
      "Invalid type for 'max_tokens': expected an integer.",
    ],
    [
      "seed",
      `{"model": "tiny", "prompt": "Hi", "seed": -1${zeros}1}`,
      /expected an integer from -9223372036854775808 to 9223372036854775807 \(int64\)/,
    ],
    [
      "priority",
      `{"model": "tiny", "prompt": "Hi", "priority": "-${zeros}1${zeros}"}`,
      int32Message("priority"),
    ],
    ["prompt", `{"model": "tiny", "prompt": [1, 2, 1${zeros}1]}`, int32Message("prompt")],
  ])("%s", async (param, body, message) => {
    const res = await checkedFetch(`${stack.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    const answer: Answer = {
      status: res.status,
      requestId: res.headers.get("x-request-id") ?? undefined,
      json: (await res.json()) as Answer["json"],
    };
    expectEnvelope(answer, param, message);
  });
});

describe("while a max-size body is decoded, other callers are served", () => {
  it("a prompt of token ids shaped 1, 1,000 zeros, 1 (was hours of regex backtracking)", async () => {
    const id = `1${"0".repeat(1000)}1`;
    const count = Math.floor(MAX_BODY / (id.length + 1));
    const body = Buffer.from(
      `{"model": "tiny", "max_tokens": 1, "prompt": [${Array(count).fill(id).join(",")}]}`,
    );
    expect(body.length).toBeGreaterThan(7e6);
    const { answer, served } = await answersWhileDecoding(body);
    expectEnvelope(answer, "prompt", int32Message("prompt"));
    expect(served).toBeGreaterThanOrEqual(3);
  });

  it("steering vectors of 12-character floats (refused: hidden size 4096, not the model's)", async () => {
    let state = 1;
    const next = () => {
      state = (state * 48271) % 2147483647;
      return ((state / 2147483647 - 0.5) * 0.2).toFixed(10).slice(0, 12);
    };
    const row = () => `[${Array.from({ length: 4096 }, next).join(",")}]`;
    const rows = Math.floor(MAX_BODY / row().length);
    const body = Buffer.from(
      `{"model": "tiny", "prompt": "Hi", "max_tokens": 1, "apply_steering_vectors": [{"activations": [${Array.from({ length: rows }, row).join(",")}], "layer_indices": [0]}]}`,
    );
    expect(body.length).toBeGreaterThan(7e6);
    const { answer, served } = await answersWhileDecoding(body);
    expectEnvelope(answer, "apply_steering_vectors[0].activations", /.+/);
    expect(served).toBeGreaterThanOrEqual(3);
  });

  it("a prompt of 1.2 million token ids (refused: longer than the model's context)", async () => {
    let state = 7;
    const ids = Array.from({ length: 1_250_000 }, () => {
      state = (state * 48271) % 2147483647;
      return state % 128_000;
    });
    const body = Buffer.from(`{"model": "tiny", "max_tokens": 1, "prompt": [${ids.join(",")}]}`);
    expect(body.length).toBeGreaterThan(7e6);
    const { answer, served } = await answersWhileDecoding(body);
    expect(answer.status).toBe(400);
    expect(answer.json.error.param).toBe("prompt");
    expect(served).toBeGreaterThanOrEqual(3);
  });
});
