// The streams bench's client process (bench/streams/stream-client.ts) against a real gateway in
// front of the bench's fake vLLM: SSE and Connect streams counted complete only with every chunk.
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFakeVllm } from "../../bench/hotpath/fake-vllm.js";
import { type StreamClient, type StreamJob, startStreamClient } from "../../bench/streams/stream-client.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

const CHUNKS = 4;
const fake = createFakeVllm({ chunks: CHUNKS });
let stack: Stack;
let client: StreamClient;
beforeAll(async () => {
  await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
  const upstreamUrl = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  stack = await startStack({ upstreamUrl, model: { id: "bench-model", servedModelName: "bench-model" } });
  client = await startStreamClient();
});
afterAll(async () => {
  client?.close();
  await stack?.close();
  fake.closeAllConnections();
  await new Promise((r) => fake.close(r));
});

const job = (protocol: "rest" | "connect", chunks: number): StreamJob => ({
  url: stack.url,
  count: 6,
  body: JSON.stringify({ model: "bench-model", prompt: "The sky is", max_tokens: CHUNKS, stream: true }),
  chunks,
  rampMs: 50,
  protocol,
});

/** How many values a [value, count] histogram holds. */
const total = (h: Array<[number, number]>) => h.reduce((a, [, n]) => a + n, 0);

describe("streams bench client", () => {
  for (const protocol of ["rest", "connect"] as const) {
    it(`${protocol}: every stream complete, a first chunk each and the gaps between the others`, async () => {
      const report = await client.run(job(protocol, CHUNKS), () => undefined);
      expect(report.failures).toStrictEqual({});
      expect(report.ok).toBe(6);
      expect(total(report.firstChunk)).toBe(6);
      expect(total(report.gaps)).toBe(6 * (CHUNKS - 1));
    });

    it(`${protocol}: a stream with fewer chunks than expected is a failure, by its count`, async () => {
      const report = await client.run(job(protocol, CHUNKS + 1), () => undefined);
      expect(report.ok).toBe(0);
      expect(report.failures).toStrictEqual({ [`${CHUNKS} of ${CHUNKS + 1} chunks`]: 6 });
    });
  }
});
