// The hot-path bench's floor servers (bench/hotpath/floor-server.ts) and its load worker's GET cells.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFakeVllm, fakeCompletionText } from "../../bench/hotpath/fake-vllm.js";
import { createFastifyFloor, createHttpFloor } from "../../bench/hotpath/floor-server.js";
import { runLoad } from "../../bench/hotpath/load-worker.js";

const CHUNKS = 7;
const fake = createFakeVllm({ chunks: CHUNKS });
const httpFloor: Server = createHttpFloor(CHUNKS);
const fastifyFloor: FastifyInstance = createFastifyFloor(CHUNKS);
const urls: Record<"fake" | "http" | "fastify", string> = { fake: "", http: "", fastify: "" };

const origin = (server: Server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

beforeAll(async () => {
  await new Promise<void>((r) => fake.listen(0, "127.0.0.1", r));
  await new Promise<void>((r) => httpFloor.listen(0, "127.0.0.1", r));
  await fastifyFloor.listen({ port: 0, host: "127.0.0.1" });
  urls.fake = origin(fake);
  urls.http = origin(httpFloor);
  urls.fastify = origin(fastifyFloor.server);
});
afterAll(async () => {
  for (const s of [fake, httpFloor]) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  await fastifyFloor.close();
});

const post = (base: string, body: string) =>
  fetch(`${base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });

describe("floor servers", () => {
  it("answer a completion with the fake's text, on node:http and on fastify alike", async () => {
    const body = JSON.stringify({ model: "bench-model", prompt: "The sky is", max_tokens: CHUNKS });
    const fakeAnswer = (await (await post(urls.fake, body)).json()) as {
      choices: Array<{ text: string }>;
    };
    const answers: unknown[] = [];
    for (const framework of ["http", "fastify"] as const) {
      const res = await post(urls[framework], body);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toMatch(/^application\/json/);
      const json = (await res.json()) as {
        object: string;
        choices: Array<{ text: string; finish_reason: string }>;
        usage: { completion_tokens: number };
      };
      expect(json.object).toBe("text_completion");
      expect(json.choices[0]?.text).toBe(fakeCompletionText(CHUNKS));
      expect(json.choices[0]?.text).toBe(fakeAnswer.choices[0]?.text);
      expect(json.usage.completion_tokens).toBe(CHUNKS);
      answers.push(json);
    }
    expect(answers[0]).toStrictEqual(answers[1]);
  });

  it("parse the body: not JSON is a 400 on both", async () => {
    for (const framework of ["http", "fastify"] as const) {
      expect((await post(urls[framework], "{not json")).status).toBe(400);
    }
  });

  it("have no other route", async () => {
    for (const framework of ["http", "fastify"] as const) {
      expect((await fetch(`${urls[framework]}/v1/models`)).status).toBe(404);
    }
  });
});

describe("load worker", () => {
  it("runs GET cells without a body, and POST cells with one", async () => {
    // Requests seen, counted by `METHOD url bytes`.
    const seen = new Map<string, number>();
    const server = createServer((req, res) => {
      let bytes = 0;
      req.on("data", (d: Buffer) => {
        bytes += d.length;
      });
      req.on("end", () => {
        const key = `${req.method} ${req.url} ${bytes}`;
        seen.set(key, (seen.get(key) ?? 0) + 1);
        res.end("ok");
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    try {
      const job = {
        url: origin(server),
        headers: {},
        body: '{"a":1}',
        connections: 1,
        warmupS: 0,
        measureS: 0.2,
        cpuPids: [],
      };
      const get = await runLoad({ ...job, path: "/healthz", method: "GET" });
      expect(get.count).toBeGreaterThan(0);
      expect(get.non2xx).toBe(0);
      const post = await runLoad(job);
      expect(post.count).toBeGreaterThan(0);
      // Only these two kinds of request came (a GET of the first cell may still arrive in the second).
      expect([...seen.keys()].sort()).toStrictEqual(["GET /healthz 0", "POST /v1/completions 7"]);
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });
});
