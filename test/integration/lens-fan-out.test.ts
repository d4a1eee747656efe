// The lens fan-out (proto/API.md §6): capture and steering with several prompts and/or n > 1, one
// Inference request per prompt × sample. Against the reference engine (deterministic with a seed):
// every choice equals the one-prompt request of its prompt with seed s + k, tensors exact; REST
// and Connect agree; streams send each choice's activations after its last text chunk. Against a
// scripted upstream with keys on: one failing sub-request fails the request with the envelope,
// aborts the others, and the Hold is settled.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { Dtype } from "../../gen/acs/v1/lens_pb.js";
import { decodeTensor, tensorFromVllmLensJson, type VllmLensTensorJson } from "../../src/lens/index.js";
import { until } from "../helpers/hang-guard.js";
import { parseSse, sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { chunk, type FakeUpstream, sse, startFakeUpstream, withVllmOps } from "../upstream/fake-upstream.js";

let dir: string;
let stack: Stack;
let key: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "acs-fan-out-"));
  stack = await startStack({ dbPath: join(dir, "engine.db") });
  key = (await stack.ledger!.createKey({ budgetTokens: 10_000_000 })).key;
});
afterAll(async () => {
  await stack?.close();
  rmSync(dir, { recursive: true, force: true });
});

interface Activations {
  residual_stream: VllmLensTensorJson;
}
interface Choice {
  index: number;
  text: string;
  finish_reason: string | null;
  prompt_token_ids: number[] | null;
  token_ids: number[] | null;
  activations?: Activations;
}
interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}
interface Completion {
  choices: Choice[];
  usage: Usage;
  activations?: Activations;
}

async function post(body: Record<string, unknown>, to: Stack = stack, auth = key): Promise<Response> {
  return fetch(`${to.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${auth}` },
    body: JSON.stringify({ model: to.alias, ...body }),
  });
}

async function complete(body: Record<string, unknown>): Promise<Completion> {
  const res = await post(body);
  const json = (await res.json()) as Completion;
  expect(res.status, JSON.stringify(json)).toBe(200);
  return json;
}

function values(activations: Activations | undefined): number[] {
  if (activations === undefined) throw new Error("no activations");
  return Array.from(decodeTensor(tensorFromVllmLensJson(activations.residual_stream)));
}

const prompts = ["Hello there", "The cat sat", "A b c d e"];
const seed = 4242;
const captureBody = {
  max_tokens: 4,
  temperature: 0.9,
  seed,
  ignore_eos: true,
  return_token_ids: true,
  output_residual_stream: [1, 3],
};

/** The REST answer to the 3 prompts × n = 2 capture (set by the first describe). */
let fan: Completion;

describe("capture with 3 prompts × n = 2", () => {
  /** singles[p][k]: the one-prompt request of prompt p with seed + k. */
  const singles: Completion[][] = [];
  beforeAll(async () => {
    fan = await complete({ ...captureBody, prompt: prompts, n: 2 });
    for (const prompt of prompts) {
      const row: Completion[] = [];
      for (const k of [0, 1]) row.push(await complete({ ...captureBody, prompt, seed: seed + k }));
      singles.push(row);
    }
  });

  it("gives 6 choices, index p × n + k, each with the activations of the one-prompt capture of its prompt and seed s + k", () => {
    expect(fan.activations).toBeUndefined();
    expect(fan.choices.map((c) => c.index)).toEqual([0, 1, 2, 3, 4, 5]);
    prompts.forEach((_, p) => {
      for (const k of [0, 1]) {
        const choice = fan.choices[p * 2 + k] as Choice;
        const single = singles[p]?.[k] as Completion;
        const one = single.choices[0] as Choice;
        // the one-prompt form keeps its place: top level, nothing on the choice
        expect(one.activations).toBeUndefined();
        expect(single.activations).toBeDefined();
        expect(choice.text).toBe(one.text);
        expect(choice.token_ids).toEqual(one.token_ids);
        expect(choice.prompt_token_ids).toEqual(one.prompt_token_ids);
        expect(choice.activations?.residual_stream.shape).toEqual(single.activations?.residual_stream.shape);
        expect(choice.activations?.residual_stream.shape).toEqual([
          2,
          (one.prompt_token_ids?.length ?? 0) + (one.token_ids?.length ?? 0) - 1,
          stack.engine?.model.hiddenSize,
        ]);
        expect(values(choice.activations)).toStrictEqual(values(single.activations));
      }
    });
    // The seed rule gives the samples of a prompt their own draws: not all pairs alike.
    expect(prompts.some((_, p) => fan.choices[2 * p]?.text !== fan.choices[2 * p + 1]?.text)).toBe(true);
  });

  it("sums the sub-requests' usage", () => {
    const all = singles.flat();
    expect(fan.usage).toEqual({
      prompt_tokens: all.reduce((a, s) => a + s.usage.prompt_tokens, 0),
      completion_tokens: 24,
      total_tokens: all.reduce((a, s) => a + s.usage.total_tokens, 0),
      prompt_tokens_details: null,
    });
  });

  it("gives Connect the same choices and tensors", async () => {
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1", useBinaryFormat: true }),
    );
    const res = await client.createCompletion(
      create(CreateCompletionRequestSchema, {
        model: "tiny",
        prompt: { case: "texts", value: { values: prompts } },
        n: 2,
        maxTokens: 4,
        temperature: 0.9,
        seed: BigInt(seed),
        ignoreEos: true,
        returnTokenIds: true,
        outputResidualStream: { layerIndices: [1, 3] },
      }),
      { headers: { authorization: `Bearer ${key}` } },
    );
    expect(res.activations).toBeUndefined();
    expect(res.choices.map((c) => c.index)).toEqual([0, 1, 2, 3, 4, 5]);
    res.choices.forEach((c, i) => {
      const rest = fan.choices[i] as Choice;
      expect(c.text).toBe(rest.text);
      expect(c.tokenIds).toEqual(rest.token_ids);
      const tensor = c.activations?.residualStream;
      expect(tensor?.shape).toEqual(rest.activations?.residual_stream.shape);
      expect(Array.from(decodeTensor(tensor!))).toStrictEqual(values(rest.activations));
    });
    expect(res.usage?.totalTokens).toBe(fan.usage.total_tokens);
  });

  it("streams each choice's activations in a chunk of its own after that choice's last text chunk", async () => {
    const res = await post({
      ...captureBody,
      prompt: prompts,
      n: 2,
      return_token_ids: false,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(res.status).toBe(200);
    // biome-ignore lint/suspicious/noExplicitAny: chunks are checked field by field below
    const chunks = sseChunks<any>(await res.text());
    const last = chunks[chunks.length - 1];
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual({
      prompt_tokens: fan.usage.prompt_tokens,
      completion_tokens: 24,
      total_tokens: fan.usage.total_tokens,
    });
    for (let i = 0; i < 6; i++) {
      const at = chunks.flatMap((c, pos) =>
        c.choices.some((ch: Choice) => ch.index === i) ? [{ c, pos }] : [],
      );
      const withActivations = at.filter(({ c }) => c.choices[0].activations !== undefined);
      expect(withActivations).toHaveLength(1);
      const act = withActivations[0]!;
      // right after the choice's last text chunk: the last chunk of this choice, after its finish
      expect(at[at.length - 1]?.pos).toBe(act.pos);
      expect(at[at.length - 2]?.c.choices[0].finish_reason).toBe("length");
      expect(act.c.choices).toEqual([
        {
          index: i,
          text: "",
          logprobs: null,
          finish_reason: null,
          stop_reason: null,
          prompt_token_ids: null,
          token_ids: null,
          activations: act.c.choices[0].activations,
        },
      ]);
      expect(act.c.activations).toBeUndefined();
      expect(act.c.usage).toBeNull();
      const text = at.map(({ c }) => c.choices[0].text).join("");
      expect(text).toBe(fan.choices[i]?.text);
      expect(values(act.c.choices[0].activations)).toStrictEqual(values(fan.choices[i]?.activations));
    }
  });

  it("streams the same per-choice activations over Connect", async () => {
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1" }),
    );
    const got = new Map<number, number[]>();
    for await (const c of client.streamCompletion(
      create(CreateCompletionRequestSchema, {
        model: "tiny",
        prompt: { case: "texts", value: { values: prompts } },
        n: 2,
        maxTokens: 4,
        temperature: 0.9,
        seed: BigInt(seed),
        ignoreEos: true,
        outputResidualStream: { layerIndices: [1, 3] },
      }),
      { headers: { authorization: `Bearer ${key}` } },
    )) {
      expect(c.activations).toBeUndefined();
      for (const ch of c.choices) {
        if (ch.activations?.residualStream !== undefined) {
          expect(got.has(ch.index)).toBe(false);
          got.set(ch.index, Array.from(decodeTensor(ch.activations.residualStream)));
        }
      }
    }
    expect([...got.keys()].sort()).toEqual([0, 1, 2, 3, 4, 5]);
    for (const [i, v] of got) expect(v).toStrictEqual(values(fan.choices[i]?.activations));
  });
});

describe("ACS_FANOUT_CONCURRENCY = 1", () => {
  let serial: Stack;
  beforeAll(async () => {
    const engine = stack.engine!;
    serial = await startStack({
      upstreamUrl: engine.url,
      lensFanOutConcurrency: 1,
      model: {
        id: engine.model.id,
        servedModelName: engine.model.id,
        maxModelLen: engine.model.maxModelLen,
        hiddenSize: engine.model.hiddenSize,
        numLayers: engine.model.numLayers,
      },
    });
  });
  afterAll(async () => {
    await serial?.close();
  });

  it("runs the sub-requests one at a time: each choice's chunks, then its activations chunk, in index order", async () => {
    const res = await post({ ...captureBody, prompt: prompts, n: 2, stream: true }, serial);
    expect(res.status).toBe(200);
    // biome-ignore lint/suspicious/noExplicitAny: chunks are checked field by field below
    const chunks = sseChunks<any>(await res.text());
    const order = chunks.map((c) => `${c.choices[0].index}${c.choices[0].activations ? "a" : ""}`);
    const want = [0, 1, 2, 3, 4, 5].flatMap((i) => [...Array(4).fill(`${i}`), `${i}a`]);
    expect(order).toEqual(want);
    chunks
      .filter((c) => c.choices[0].activations !== undefined)
      .forEach((c, i) => {
        expect(values(c.choices[0].activations)).toStrictEqual(values(fan.choices[i]?.activations));
      });
  });
});

describe("echo and logprobs in a fan-out", () => {
  it("keep their meaning per choice: each choice equals the one-prompt request of its prompt and seed s + k", async () => {
    const body = { ...captureBody, echo: true, logprobs: 2, output_residual_stream: [0] };
    const two = prompts.slice(0, 2);
    const fanned = await complete({ ...body, prompt: two, n: 2 });
    for (const [p, prompt] of two.entries()) {
      for (const k of [0, 1]) {
        const single = await complete({ ...body, prompt, seed: seed + k });
        const choice = fanned.choices[p * 2 + k] as Choice & { logprobs: unknown };
        const one = single.choices[0] as Choice & { logprobs: unknown };
        expect(choice.text.startsWith(prompt)).toBe(true);
        expect(choice.text).toBe(one.text);
        expect(choice.logprobs).toEqual(one.logprobs);
        expect(values(choice.activations)).toStrictEqual(values(single.activations));
      }
    }
  });
});

describe("the Hold of a fan-out (keys on)", () => {
  it.each([false, true])(
    "stream %s: covers every sub-request and is settled to their total",
    async (stream) => {
      const ledger = stack.ledger!;
      const created = await ledger.createKey({ budgetTokens: 100_000 });
      const res = await post(
        {
          ...captureBody,
          prompt: prompts,
          n: 2,
          ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
        },
        stack,
        created.key,
      );
      expect(res.status).toBe(200);
      const text = await res.text();
      const usage = stream
        ? (sseChunks<{ usage: Usage | null }>(text).at(-1)?.usage as Usage)
        : (JSON.parse(text) as Completion).usage;
      expect(usage.total_tokens).toBe(fan.usage.total_tokens);
      const after = await ledger.usage(created.id);
      expect(after.openHolds).toBe(0);
      // A stream's captures each cost one replay prefill of prompt + generated − 1 tokens more.
      const replays = stream
        ? fan.choices.reduce((a, c) => a + (c.prompt_token_ids?.length ?? 0) + 4 - 1, 0)
        : 0;
      expect(after.spentTokens).toBe(usage.total_tokens + replays);
    },
  );
});

describe("steering with several prompts", () => {
  const hidden = 64; // tiny preset
  const vector = {
    activations: {
      data: Buffer.from(
        new Float32Array(Array.from({ length: hidden }, (_, i) => (i % 2 === 0 ? 40 : -40))).buffer,
      ).toString("base64"),
      dtype: "float32",
      shape: [1, hidden],
      compression: null,
    },
    layer_indices: [1],
  };
  const body = { max_tokens: 6, temperature: 0, ignore_eos: true, return_token_ids: true };

  it("steers every prompt: each choice differs from the unsteered one and equals the one-prompt steered request", async () => {
    const two = prompts.slice(0, 2);
    const plain = await complete({ ...body, prompt: two });
    const steered = await complete({ ...body, prompt: two, apply_steering_vectors: [vector] });
    expect(steered.choices.map((c) => c.index)).toEqual([0, 1]);
    for (const [p, prompt] of two.entries()) {
      const single = await complete({ ...body, prompt, apply_steering_vectors: [vector] });
      expect(steered.choices[p]?.token_ids).not.toEqual(plain.choices[p]?.token_ids);
      expect(steered.choices[p]?.token_ids).toEqual(single.choices[0]?.token_ids);
      expect(steered.choices[p]?.activations).toBeUndefined();
    }
    expect(steered.activations).toBeUndefined();
  });
});

describe("a failing sub-request (scripted Inference, keys on)", () => {
  let upstream: FakeUpstream;
  let scripted: Stack;
  const hidden = 64; // the scripted model's facts (start-stack's defaults)
  const steer = {
    activations: {
      data: Buffer.from(new Float32Array(hidden).fill(0.5).buffer).toString("base64"),
      dtype: "float32",
      shape: [1, hidden],
      compression: null,
    },
    layer_indices: [1],
  };
  /** "hang" sub-requests received since the test began. */
  let hangs = 0;

  beforeAll(async () => {
    upstream = await startFakeUpstream(
      withVllmOps(async (req, res, body) => {
        if (req.url === "/tokenize") {
          res.setHeader("content-type", "application/json");
          res.end(JSON.stringify({ count: 2, max_model_len: 512, tokens: [1, 2] }));
          return;
        }
        const { prompt } = JSON.parse(body) as { prompt: string };
        if (prompt === "fail") {
          // Fails once both other sub-requests are in flight, so the gateway must abort them.
          await until(() => hangs >= 2, "both hanging sub-requests arrived");
          res.writeHead(500, { "content-type": "application/json" });
          res.end(
            JSON.stringify({ object: "error", message: "boom", type: "InternalServerError", code: 500 }),
          );
          return;
        }
        // "hang": one token, then nothing until the gateway goes away.
        hangs++;
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(sse([chunk(0, "t", null, { token_ids: [10] })], false));
      }),
    );
    scripted = await startStack({ upstreamUrl: upstream.url, dbPath: join(dir, "scripted.db") });
  });
  afterAll(async () => {
    await scripted?.close();
    await upstream?.close();
  });

  it.each([false, true])("stream %s: the envelope, the others aborted, the Hold settled", async (stream) => {
    const ledger = scripted.ledger!;
    const created = await ledger.createKey({ budgetTokens: 1000 });
    const seen = upstream.requests.length;
    hangs = 0;
    const res = await post(
      {
        prompt: ["hang", "fail", "hang"],
        max_tokens: 5,
        apply_steering_vectors: [steer],
        ...(stream ? { stream: true } : {}),
      },
      scripted,
      created.key,
    );
    const text = await res.text();
    // Before the stream started: the status; after: the in-band error event, then [DONE].
    const error =
      res.status === 200
        ? (
            parseSse(text).find((b) => b.kind === "data" && "error" in (b.data as object)) as {
              data: { error: unknown; request_id: string };
            }
          )?.data
        : (JSON.parse(text) as { error: unknown; request_id: string });
    if (res.status !== 200) expect(res.status).toBe(502);
    expect(stream || res.status !== 200).toBe(true);
    expect(error?.error).toEqual({
      message: "Inference failed (HTTP 500).",
      type: "server_error",
      param: null,
      code: "upstream_error",
    });
    expect(error?.request_id).toBe(res.headers.get("x-request-id"));
    const mine = upstream.requests.slice(seen).filter((r) => r.url === "/v1/completions");
    expect(mine).toHaveLength(3);
    // each sub-request: one prompt, n = 1, the same steering
    for (const r of mine) {
      const b = JSON.parse(r.body) as { n: number; vllm_xargs: Record<string, string> };
      expect(b.n).toBe(1);
      expect(JSON.parse(b.vllm_xargs.apply_steering_vectors as string)).toHaveLength(1);
    }
    const hung = mine.filter((r) => JSON.parse(r.body).prompt === "hang");
    expect(await Promise.all(hung.map((r) => r.closed))).toEqual([{ aborted: true }, { aborted: true }]);
    const usage = await ledger.usage(created.id);
    expect(usage.openHolds).toBe(0);
    // prompt tokens (2) of each of the 3 sub-requests + the one token each hanging one streamed
    expect(usage.spentTokens).toBe(3 * 2 + 2);
  });

  it("gives Connect the same envelope", async () => {
    const ledger = scripted.ledger!;
    const created = await ledger.createKey({ budgetTokens: 1000 });
    hangs = 0;
    const rest = await post(
      { prompt: ["hang", "fail", "hang"], max_tokens: 5, apply_steering_vectors: [steer] },
      scripted,
      created.key,
    );
    const restError = ((await rest.json()) as { error: unknown }).error;
    hangs = 0;
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: scripted.url, httpVersion: "1.1" }),
    );
    const err = await client
      .createCompletion(
        create(CreateCompletionRequestSchema, {
          model: scripted.alias,
          prompt: { case: "texts", value: { values: ["hang", "fail", "hang"] } },
          maxTokens: 5,
          applySteeringVectors: [
            {
              activations: {
                dtype: Dtype.FLOAT32,
                shape: [1, hidden],
                data: new Uint8Array(new Float32Array(hidden).fill(0.5).buffer),
              },
              layerIndices: [1],
            },
          ],
        }),
        { headers: { authorization: `Bearer ${created.key}` } },
      )
      .then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    expect(err?.code).toBe(Code.Unavailable);
    const envelope = err?.findDetails(ErrorEnvelopeSchema)[0]?.error;
    expect({
      message: envelope?.message,
      type: envelope?.type,
      param: envelope?.param ?? null,
      code: envelope?.code,
    }).toEqual(restError);
    await until(async () => (await ledger.usage(created.id)).openHolds === 0, "every Hold settled");
  });

  it("a caller who goes away mid-stream aborts every sub-request and is charged what was generated", async () => {
    const ledger = scripted.ledger!;
    const created = await ledger.createKey({ budgetTokens: 1000 });
    const seen = upstream.requests.length;
    hangs = 0;
    const caller = new AbortController();
    const res = await fetch(`${scripted.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${created.key}` },
      body: JSON.stringify({
        model: scripted.alias,
        prompt: ["hang", "hang"],
        n: 2,
        max_tokens: 5,
        apply_steering_vectors: [steer],
        stream: true,
      }),
      signal: caller.signal,
    });
    expect(res.status).toBe(200);
    await until(() => hangs === 4, "all four sub-requests in flight");
    caller.abort();
    const mine = upstream.requests.slice(seen).filter((r) => r.url === "/v1/completions");
    expect(mine).toHaveLength(4);
    expect(await Promise.all(mine.map((r) => r.closed))).toEqual(Array(4).fill({ aborted: true }));
    await until(async () => (await ledger.usage(created.id)).openHolds === 0, "the Hold settled");
    // each of the 4 sub-requests: its prompt (2) + the one token it streamed
    expect((await ledger.usage(created.id)).spentTokens).toBe(4 * 3);
  });
});
