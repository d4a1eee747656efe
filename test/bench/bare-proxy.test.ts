// The hot-path bench's bare proxy (bench/hotpath/bare-proxy.ts): bytes through unchanged, both ways.
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createBareProxy } from "../../bench/hotpath/bare-proxy.js";
import { createFakeVllm } from "../../bench/hotpath/fake-vllm.js";
import { freePort } from "../helpers/processes.js";

const fake = createFakeVllm({ chunks: 5 });
let fakeUrl: string;
let proxy: ReturnType<typeof createBareProxy>;
let proxyUrl: string;
beforeAll(async () => {
  await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
  fakeUrl = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  proxy = createBareProxy(fakeUrl);
  await new Promise<void>((r) => proxy.server.listen(0, "127.0.0.1", r));
  proxyUrl = `http://127.0.0.1:${(proxy.server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  proxy.server.closeAllConnections();
  await new Promise((r) => proxy.server.close(r));
  await proxy.pool.close();
  fake.closeAllConnections();
  await new Promise((r) => fake.close(r));
});

/** The same request to the fake directly and through the proxy: status, content type, body. */
async function both(path: string, init: RequestInit = {}) {
  const one = async (base: string) => {
    const res = await fetch(base + path, init);
    // Only `created` (Unix seconds) may differ between the two answers.
    const body = (await res.text()).replace(/"created":\d+/g, '"created":0');
    return { status: res.status, type: res.headers.get("content-type"), body };
  };
  return { direct: await one(fakeUrl), proxied: await one(proxyUrl) };
}

const completion = (body: object) => ({
  method: "POST",
  headers: { "content-type": "application/json", "x-request-id": "same" },
  body: JSON.stringify({ model: "bench-model", prompt: "The sky is", max_tokens: 5, ...body }),
});

describe("bare proxy", () => {
  it("passes a non-stream completion, a stream, an error and a GET through unchanged", async () => {
    for (const [path, init] of [
      ["/v1/completions", completion({ return_token_ids: true })],
      ["/v1/completions", completion({ stream: true, stream_options: { include_usage: true } })],
      ["/v1/completions", completion({ logprobs: 2 })],
      ["/tokenize", completion({})],
      ["/v1/models", {}],
      ["/health", {}],
    ] as const) {
      const { direct, proxied } = await both(path, init);
      if (path !== "/health") expect(direct.body.length).toBeGreaterThan(10);
      expect(proxied).toStrictEqual(direct);
    }
  });

  it("answers 502 when the upstream is down, and its own /healthz all the same", async () => {
    const down = createBareProxy(`http://127.0.0.1:${await freePort()}`);
    await new Promise<void>((r) => down.server.listen(0, "127.0.0.1", r));
    try {
      const base = `http://127.0.0.1:${(down.server.address() as AddressInfo).port}`;
      const res = await fetch(`${base}/health`);
      expect(res.status).toBe(502);
      // The streams bench probes the proxy's own liveness, as the gateway's: not the upstream's.
      const own = await fetch(`${base}/healthz`);
      expect(own.status).toBe(200);
      expect(await own.text()).toBe("ok");
    } finally {
      down.server.closeAllConnections();
      await new Promise((r) => down.server.close(r));
      await down.pool.close();
    }
  });
});
