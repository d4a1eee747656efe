// The memory a small request can make the gateway hold: zstd steering tensors that inflate to the
// legal maximum (2^23 float32 = 32 MiB from ~5 KB of JSON), many at once, against an Inference
// that does not read their bodies until the test lets it. The budget of decoded steering bytes
// admits what fits, answers the rest 429 rate_limited (Retry-After) on REST and Connect alike,
// serves other callers meanwhile, and counts its peak on /metrics.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CompletionsService, CreateCompletionRequestSchema } from "../../gen/acs/v1/completions_pb.js";
import { ErrorEnvelopeSchema } from "../../gen/acs/v1/error_pb.js";
import { Compression, Dtype } from "../../gen/acs/v1/lens_pb.js";
import { zstdCompress } from "../../src/lens/index.js";
import { type Stack, startStack } from "../helpers/start-stack.js";
import { answerCompletion, chunk } from "../upstream/fake-upstream.js";

const MiB = 2 ** 20;
const [LAYERS, POSITIONS, HIDDEN] = [32, 64, 4096];
/** 2^23 float32 numbers (32 MiB) of a pattern, and its zstd frame (a few KB). */
const values = new Float32Array(LAYERS * POSITIONS * HIDDEN).map((_, i) => ((i % 7) - 3) * 0.25);
const frame = new Uint8Array(zstdCompress(new Uint8Array(values.buffer)));
const layerIndices = Array.from({ length: LAYERS }, (_, i) => i);
const positionIndices = Array.from({ length: POSITIONS }, (_, i) => i);

const restBody = JSON.stringify({
  model: "tiny",
  prompt: "The sky is",
  max_tokens: 1,
  apply_steering_vectors: [
    {
      activations: {
        data: Buffer.from(frame).toString("base64"),
        dtype: "float32",
        shape: [LAYERS, POSITIONS, HIDDEN],
        compression: "zstd",
      },
      layer_indices: layerIndices,
      position_indices: positionIndices,
    },
  ],
});

/**
 * A scripted Inference: small completion bodies are answered at once; a body over 1 MiB waits,
 * unread, until `open()` (so its request stays in flight), then is read and kept for checking.
 */
function startGatedUpstream() {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  const bodies: Buffer[] = [];
  let waiting = 0;
  /** Inference's answer to `body`: one token, streamed or not as the body asks. */
  const answer = (res: ServerResponse, body: Buffer) =>
    answerCompletion(res, body.toString(), [
      chunk(0, " ok", "length", { token_ids: [7] }),
      {
        ...chunk(0, ""),
        choices: [],
        usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
      },
    ]);
  const read = async (req: IncomingMessage) => {
    const chunks: Buffer[] = [];
    for await (const c of req as AsyncIterable<Buffer>) chunks.push(c);
    return Buffer.concat(chunks);
  };
  const server: Server = createServer((req, res) => {
    void (async () => {
      if (req.method === "GET" && req.url === "/health") return void res.end();
      if (req.method === "GET" && req.url === "/v1/models") {
        res.setHeader("content-type", "application/json");
        const data = [{ id: "acs/fake", object: "model", owned_by: "vllm", max_model_len: 1024 }];
        return void res.end(JSON.stringify({ object: "list", data }));
      }
      if (req.url === "/tokenize") {
        await read(req);
        res.setHeader("content-type", "application/json");
        return void res.end(JSON.stringify({ count: 3, tokens: [1, 2, 3], max_model_len: 1024 }));
      }
      if (Number(req.headers["content-length"] ?? Number.POSITIVE_INFINITY) > MiB) {
        req.pause();
        waiting++;
        await gate;
        const body = await read(req);
        bodies.push(body);
        answer(res, body);
      } else {
        answer(res, await read(req));
      }
    })().catch(() => res.destroy());
  });
  return { server, bodies, open, waiting: () => waiting };
}

async function post(url: string, body: string) {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  return {
    status: res.status,
    retryAfter: res.headers.get("retry-after"),
    json: (await res.json()) as {
      error?: { code: string; type: string; param: string | null; message: string };
    },
  };
}

type Answer = Awaited<ReturnType<typeof post>>;

/** Polls `check` until it holds (no time limit of its own: the test's timeout applies). */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 20));
}

async function gauges(url: string) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (name: string) =>
    Number(/^(\S+) (\S+)$/m.exec(text.split("\n").find((l) => l.startsWith(`${name} `)) ?? "")?.[2]);
  return {
    inFlight: read("acs_steering_bytes_in_flight"),
    peak: read("acs_steering_bytes_in_flight_peak"),
    limit: read("acs_steering_bytes_limit"),
  };
}

const connectRequest = () =>
  create(CreateCompletionRequestSchema, {
    model: "tiny",
    prompt: { case: "text", value: "The sky is" },
    maxTokens: 1,
    applySteeringVectors: [
      {
        activations: {
          dtype: Dtype.FLOAT32,
          shape: [LAYERS, POSITIONS, HIDDEN],
          data: frame,
          compression: Compression.ZSTD,
        },
        layerIndices,
        positionIndices,
      },
    ],
  });

async function connectError(url: string): Promise<ConnectError> {
  const client = createClient(
    CompletionsService,
    createConnectTransport({ baseUrl: url, httpVersion: "1.1" }),
  );
  try {
    await client.createCompletion(connectRequest());
  } catch (err) {
    return ConnectError.from(err);
  }
  throw new Error("the call succeeded");
}

let upstream: ReturnType<typeof startGatedUpstream>;
let stack: Stack;

beforeAll(async () => {
  upstream = startGatedUpstream();
  await new Promise<void>((r) => upstream.server.listen(0, "127.0.0.1", r));
  const port = (upstream.server.address() as AddressInfo).port;
  stack = await startStack({
    upstreamUrl: `http://127.0.0.1:${port}`,
    model: { hiddenSize: HIDDEN, numLayers: LAYERS, maxModelLen: 1024 },
    steeringProcessBytes: 64 * MiB, // two maximal requests
  });
});
afterAll(async () => {
  upstream.open();
  await stack?.close();
  upstream.server.closeAllConnections();
  await new Promise<void>((r) => upstream.server.close(() => r()));
});

describe("ten maximal zstd steering tensors at once (process budget 64 MiB)", () => {
  it("admits two, answers eight 429 rate_limited, serves others meanwhile, and counts its peak", async () => {
    expect(restBody.length).toBeLessThan(8000);
    const early: Answer[] = [];
    const answers = Array.from({ length: 10 }, () =>
      post(stack.url, restBody).then((a) => {
        early.push(a);
        return a;
      }),
    );
    // The refusals come at once, while the admitted wait (unread) for Inference: count outcomes.
    await until(() => early.length === 8 && upstream.waiting() === 2);
    for (const a of early) {
      expect(a.status).toBe(429);
      expect(a.retryAfter).toBe("1");
      expect(a.json.error).toMatchObject({ code: "rate_limited", type: "rate_limit_error", param: null });
      expect(a.json.error?.message).toMatch(/busy decoding the steering vectors of other requests/);
    }
    expect(await gauges(stack.url)).toEqual({ inFlight: 64 * MiB, peak: 64 * MiB, limit: 64 * MiB });

    // Other callers are served meanwhile (the budget counts steering bytes only).
    const plain = await post(stack.url, JSON.stringify({ model: "tiny", prompt: "Hi", max_tokens: 1 }));
    expect(plain.status).toBe(200);

    // Connect is refused the same way, with the envelope and retry-after metadata.
    const ce = await connectError(stack.url);
    expect(ce.code).toBe(Code.ResourceExhausted);
    expect(ce.findDetails(ErrorEnvelopeSchema)[0]?.error?.code).toBe("rate_limited");
    expect(ce.metadata.get("retry-after")).toBe("1");

    upstream.open();
    const admitted = (await Promise.all(answers)).filter((a) => a.status === 200);
    expect(admitted).toHaveLength(2);
    expect(await gauges(stack.url)).toEqual({ inFlight: 0, peak: 64 * MiB, limit: 64 * MiB });

    // What Inference read is the tensor the caller sent, as raw float32 in vllm-lens's legacy dict.
    expect(upstream.bodies).toHaveLength(2);
    for (const body of upstream.bodies) {
      const sent = JSON.parse(body.toString("utf8")) as { vllm_xargs: { apply_steering_vectors: string } };
      const [vector] = JSON.parse(sent.vllm_xargs.apply_steering_vectors) as Array<{
        activations: { data: string; dtype: string; shape: number[] };
        layer_indices: number[];
        position_indices: number[];
      }>;
      expect(vector!.activations.dtype).toBe("float32");
      expect(vector!.activations.shape).toEqual([LAYERS, POSITIONS, HIDDEN]);
      expect(vector!.position_indices).toEqual(positionIndices);
      const data = Buffer.from(vector!.activations.data, "base64");
      expect(data.equals(Buffer.from(values.buffer))).toBe(true);
    }

    // With the budget free again, the same request is served.
    upstream.open();
    const again = await post(stack.url, restBody);
    expect(again.status).toBe(200);
  });
});

describe("a request that can never fit (per-request bound 16 MiB)", () => {
  it("is 413 request_too_large on REST and resource_exhausted with the envelope on Connect", async () => {
    const small = await startStack({
      upstreamUrl: stack.url.replace(
        /.*/,
        `http://127.0.0.1:${(upstream.server.address() as AddressInfo).port}`,
      ),
      model: { hiddenSize: HIDDEN, numLayers: LAYERS, maxModelLen: 1024 },
      steeringRequestBytes: 16 * MiB,
    });
    try {
      const rest = await post(small.url, restBody);
      expect(rest.status).toBe(413);
      expect(rest.retryAfter).toBeNull();
      expect(rest.json.error).toMatchObject({
        code: "request_too_large",
        param: "apply_steering_vectors",
        message: `The steering vectors of this request decode to ${32 * MiB} bytes, more than the ${16 * MiB} bytes one request may hold.`,
      });
      const ce = await connectError(small.url);
      expect(ce.code).toBe(Code.ResourceExhausted);
      expect(ce.findDetails(ErrorEnvelopeSchema)[0]?.error).toMatchObject({
        code: "request_too_large",
        param: "apply_steering_vectors",
      });
      expect((await gauges(small.url)).peak).toBe(0);
    } finally {
      await small.close();
    }
  });
});
