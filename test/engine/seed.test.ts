/**
 * `seed` is exact, as vLLM's Python int: integers beyond 2^53 are not rounded by the body parser,
 * the PRNG state comes from the full 64-bit value, sample k of n uses seed + k exactly, and the
 * range is vLLM's (torch.long: [−2^63, 2^63 − 1], else a 400 validation error).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningEngine, startEngine } from "../../src/engine/index.js";
import { keepExactIntegers, topLevelRawValue } from "../../src/engine/json-body.js";
import { createRng } from "../../src/engine/prng.js";
import { SEED_MAX, SEED_MIN } from "../../src/engine/protocol.js";

let engine: RunningEngine;
let url: string;
beforeAll(async () => {
  engine = await startEngine({ preset: "tiny" });
  url = `${engine.url}/v1/completions`;
});
afterAll(async () => {
  await engine.close();
});

interface Reply {
  choices: { token_ids: number[] }[];
  error: { message: string; param: string | null; code: number };
}

/** Posts a body whose `seed` is written as the exact decimal literal (JSON.stringify cannot). */
async function post(seed: bigint | string, extra: Record<string, unknown> = {}) {
  const fields = JSON.stringify({
    model: "acs/tiny",
    prompt: "Alice was",
    max_tokens: 24,
    temperature: 1,
    return_token_ids: true,
    ...extra,
  });
  const body = `${fields.slice(0, -1)},"seed":${String(seed)}}`;
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body });
  return { status: r.status, json: (await r.json()) as Reply };
}
const tokens = async (seed: bigint | string, extra: Record<string, unknown> = {}): Promise<number[][]> => {
  const r = await post(seed, extra);
  expect(r.status).toBe(200);
  return r.json.choices.map((c) => c.token_ids);
};

const P53 = 2n ** 53n;

describe("exact seeds", () => {
  it("2^53 and 2^53 + 1 give different samples (temperature 1); the same seed gives the same", async () => {
    const a = await tokens(P53);
    expect(await tokens(P53 + 1n)).not.toEqual(a);
    expect(await tokens(P53)).toEqual(a);
  });

  it("2^63 − 1 and 2^63 − 2 differ; each is reproducible", async () => {
    const a = await tokens(SEED_MAX);
    const b = await tokens(SEED_MAX - 1n);
    expect(a).not.toEqual(b);
    expect(await tokens(SEED_MAX)).toEqual(a);
    expect(await tokens(SEED_MAX - 1n)).toEqual(b);
  });

  it("sample k of n uses seed + k exactly (beyond 2^53)", async () => {
    const [s0, s1] = await tokens(P53 + 1n, { n: 2 });
    expect(s0).toEqual((await tokens(P53 + 1n))[0]);
    expect(s1).toEqual((await tokens(P53 + 2n))[0]);
    expect(s1).not.toEqual((await tokens(P53))[0]);
  });

  it("negative seeds down to −2^63 work (vLLM: ge=torch.long min); −1 ≠ −2", async () => {
    const m1 = await tokens(-1n);
    expect(await tokens(-1n)).toEqual(m1);
    expect(await tokens(-2n)).not.toEqual(m1);
    expect(await tokens(SEED_MIN)).toEqual(await tokens(SEED_MIN));
    expect(await tokens(-P53 - 1n)).not.toEqual(await tokens(-P53));
  });

  it("outside [−2^63, 2^63 − 1] → vLLM's 400 validation error on seed", async () => {
    const hi = await post(SEED_MAX + 1n);
    expect(hi.status).toBe(400);
    expect(hi.json.error.param).toBe("seed");
    expect(hi.json.error.message).toContain("less than or equal to 9223372036854775807");
    expect(hi.json.error.message).toContain("input_value=9223372036854775808");
    const lo = await post(SEED_MIN - 1n);
    expect(lo.status).toBe(400);
    expect(lo.json.error.message).toContain("greater than or equal to -9223372036854775808");
    expect((await post("1e19")).status).toBe(400);
    expect((await post("1.5")).status).toBe(400);
    expect((await post('"7"')).status).toBe(400);
  });

  it("small seeds and integral floats behave as before (5.0 is 5, as pydantic reads it)", async () => {
    expect(await tokens("5.0")).toEqual(await tokens(5n));
    expect(await tokens(5n)).not.toEqual(await tokens(6n));
  });

  it("other fields keep JSON.parse numbers; a huge max_tokens is still the context 400", async () => {
    const r = await post(P53 + 1n, { max_tokens: 2 ** 60 });
    expect(r.status).toBe(400);
    expect(r.json.error.param).toBe("input_tokens");
  });
});

describe("body parsing helpers", () => {
  it("finds the raw text of the last top-level key only", () => {
    const text = `{"a":{"seed":1},"s\\u0065ed":  9007199254740993 ,"b":["}",{"seed":2}],"c":"\\"seed\\":3"}`;
    expect(topLevelRawValue(text, "seed")).toBe("9007199254740993");
    expect(topLevelRawValue(`{"seed":1,"seed":18446744073709551615}`, "seed")).toBe("18446744073709551615");
    expect(topLevelRawValue(`{"x":1}`, "seed")).toBeNull();
    expect(topLevelRawValue(`[1]`, "seed")).toBeNull();
  });

  it("turns only an unsafe integer seed into a bigint", () => {
    const text = `{"seed":9223372036854775807,"n":9223372036854775807,"x":{"seed":9007199254740993}}`;
    const body = keepExactIntegers(JSON.parse(text), text) as Record<string, unknown>;
    expect(body.seed).toBe(9223372036854775807n);
    expect(body.n).toBe(2 ** 63);
    expect((body.x as Record<string, unknown>).seed).toBe(9007199254740992);
    const safe = `{"seed":42}`;
    expect((keepExactIntegers(JSON.parse(safe), safe) as Record<string, unknown>).seed).toBe(42);
  });

  it("seeds the PRNG from all 64 bits", () => {
    const first = (s: bigint) => createRng(s).nextU32();
    expect(first(P53)).not.toBe(first(P53 + 1n));
    expect(first(2n ** 63n)).toBe(first(SEED_MIN)); // mod 2^64, as torch's manual_seed
    expect(first(-1n)).toBe(first(2n ** 64n - 1n));
  });
});
