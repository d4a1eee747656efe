// Activations and steering vectors end to end: REST (JSON and SSE), Connect, the reference
// engine's own forward pass, and independent decoders (test/helpers/decode-tensor.ts).
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { roundBf16 } from "../../src/engine/index.js";
import { decodeTensor, tensorFromVllmLensJson, type VllmLensTensorJson } from "../../src/lens/index.js";
import { independentDecoders } from "../helpers/decode-tensor.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { sseChunks } from "../helpers/parse-sse.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
const layers = [1, 3];

beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});
// Every REST response also conforms to /openapi.json (test/helpers/openapi-check.ts).
afterEach(assertConforming);

interface Choice {
  text: string;
  prompt_token_ids: number[] | null;
  token_ids: number[] | null;
}
interface Completion {
  choices: Choice[];
  activations?: { residual_stream: VllmLensTensorJson };
}

async function post(body: Record<string, unknown>): Promise<Response> {
  return checkedFetch(`${stack.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", ...body }),
  });
}

async function complete(body: Record<string, unknown>): Promise<Completion> {
  const res = await post(body);
  expect(res.status).toBe(200);
  return (await res.json()) as Completion;
}

const captureBody = {
  prompt: "Hello there",
  max_tokens: 5,
  temperature: 0,
  ignore_eos: true,
  return_token_ids: true,
  output_residual_stream: layers,
};

function values(dict: VllmLensTensorJson): Float32Array {
  return decodeTensor(tensorFromVllmLensJson(dict));
}

describe("capture (output_residual_stream)", () => {
  it("returns (layers ascending, prompt + generated − 1, hidden) matching the engine's own forward", async () => {
    const res = await complete({ ...captureBody, output_residual_stream: [3, 1] });
    const choice = res.choices[0] as Choice;
    const prompt = choice.prompt_token_ids ?? [];
    const generated = choice.token_ids ?? [];
    const dict = res.activations?.residual_stream as VllmLensTensorJson;
    const hidden = stack.engine?.model.hiddenSize ?? 0;
    const positions = prompt.length + generated.length - 1;
    expect(dict.shape).toEqual([2, positions, hidden]);
    expect(dict.dtype).toBe("int16");
    expect(dict.original_dtype).toBe("torch.bfloat16");

    const got = values(dict);
    const ref = await stack.engine?.model.forward([...prompt, ...generated.slice(0, -1)]);
    // Inference returns its float32 residual stream rounded to bf16; the gateway passes the bf16
    // bits on and decodes them exactly: every number equals the engine's own, rounded alike.
    [1, 3].forEach((layer, li) => {
      const want = Array.from(ref?.residualStream[layer] as Float32Array, roundBf16);
      const layerValues = got.subarray(li * positions * hidden, (li + 1) * positions * hidden);
      expect(Array.from(layerValues)).toStrictEqual(want);
    });
  });

  it("streams the same activations in a last chunk of their own, after the usage chunk", async () => {
    const full = await complete(captureBody);
    const res = await post({
      ...captureBody,
      return_token_ids: false,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(res.status).toBe(200);
    // biome-ignore lint/suspicious/noExplicitAny: chunks are checked field by field below
    const chunks = sseChunks<any>(await res.text());
    const last = chunks[chunks.length - 1];
    const usage = chunks[chunks.length - 2];
    expect(usage.choices).toEqual([]);
    expect(usage.usage.completion_tokens).toBe(5);
    expect(last.choices).toEqual([]);
    expect(last.activations.residual_stream.shape).toEqual(full.activations?.residual_stream.shape);
    expect(Array.from(values(last.activations.residual_stream))).toEqual(
      Array.from(values(full.activations?.residual_stream as VllmLensTensorJson)),
    );
    const text = chunks.flatMap((c) => c.choices.map((ch: Choice) => ch.text)).join("");
    expect(text).toBe(full.choices[0]?.text);
    // token ids were used internally for the prefill but not asked for: null, as vLLM writes them
    for (const c of chunks) for (const ch of c.choices) expect(ch.token_ids).toBeNull();
  });

  it("gives Connect the same numbers as raw Tensor bytes", async () => {
    const rest = await complete(captureBody);
    const client = createClient(
      CompletionsService,
      createConnectTransport({ baseUrl: stack.url, httpVersion: "1.1", useBinaryFormat: true }),
    );
    const res = await client.createCompletion(
      create(CreateCompletionRequestSchema, {
        model: "tiny",
        prompt: { case: "text", value: "Hello there" },
        maxTokens: 5,
        temperature: 0,
        ignoreEos: true,
        outputResidualStream: { layerIndices: layers },
      }),
    );
    const tensor = res.activations?.residualStream;
    expect(tensor).toBeDefined();
    const fromConnect = decodeTensor(tensor as NonNullable<typeof tensor>);
    expect(Array.from(fromConnect)).toEqual(
      Array.from(values(rest.activations?.residual_stream as VllmLensTensorJson)),
    );
  });

  it.each(independentDecoders().map((d) => [d.name, d] as const))(
    "the REST tensor dict, read by an independent decoder (%s), holds the gateway's numbers",
    async (_name, decoder) => {
      const rest = await complete(captureBody);
      const dict = rest.activations?.residual_stream as VllmLensTensorJson;
      const [theirs] = decoder.decode([dict]);
      expect(theirs?.shape).toEqual(dict.shape);
      expect(Array.from(theirs?.values ?? [])).toEqual(Array.from(values(dict)));
    },
  );
});

describe("steering (apply_steering_vectors)", () => {
  const hidden = 64;
  const vector = (scale: number) => ({
    activations: [Array.from({ length: hidden }, (_, i) => Math.sin(i) * 4)],
    layer_indices: [1],
    scale,
  });
  const body = { prompt: "Once upon a time", max_tokens: 12, temperature: 0, ignore_eos: true };

  it("changes the text, and scale 0 does not", async () => {
    const plain = await complete(body);
    const steered = await complete({ ...body, apply_steering_vectors: [vector(8)] });
    const zero = await complete({ ...body, apply_steering_vectors: [vector(0)] });
    expect(steered.choices[0]?.text).not.toBe(plain.choices[0]?.text);
    expect(zero.choices[0]?.text).toBe(plain.choices[0]?.text);
  });

  it("takes the vllm-lens encoded dict as well as nested arrays", async () => {
    const values = Float32Array.from({ length: hidden }, (_, i) => Math.sin(i) * 4);
    const dict = {
      data: Buffer.from(values.buffer).toString("base64"),
      dtype: "float32",
      shape: [1, hidden],
      compression: null,
    };
    const viaArrays = await complete({ ...body, apply_steering_vectors: [vector(8)] });
    const viaDict = await complete({
      ...body,
      apply_steering_vectors: [{ activations: dict, layer_indices: [1], scale: 8 }],
    });
    expect(viaDict.choices[0]?.text).toBe(viaArrays.choices[0]?.text);
  });

  it("refuses a wrong hidden size, which the engine alone would silently ignore", async () => {
    const wrong = {
      activations: [Array.from({ length: hidden * 2 }, () => 50)],
      layer_indices: [1],
      scale: 8,
    };
    const res = await post({ ...body, apply_steering_vectors: [wrong] });
    expect(res.status).toBe(400);
    const json = (await res.json()) as { error: { param: string } };
    expect(json.error.param).toBe("apply_steering_vectors[0].activations");

    // Inference alone: vllm-lens accepts it and steers nothing (src/upstream/vllm/VLLM.md).
    const direct = await fetch(`${stack.engine?.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: stack.modelId,
        ...body,
        vllm_xargs: { apply_steering_vectors: JSON.stringify([wrong]) },
      }),
    });
    expect(direct.status).toBe(200);
    const directJson = (await direct.json()) as Completion;
    const plain = await complete(body);
    expect(directJson.choices[0]?.text).toBe(plain.choices[0]?.text);
  });

  it("streams steered text equal to the non-stream steered text", async () => {
    const full = await complete({ ...body, apply_steering_vectors: [vector(8)] });
    const res = await post({ ...body, apply_steering_vectors: [vector(8)], stream: true });
    const text = sseChunks<{ choices: Choice[] }>(await res.text())
      .flatMap((c) => c.choices.map((ch) => ch.text))
      .join("");
    expect(text).toBe(full.choices[0]?.text);
  });
});
