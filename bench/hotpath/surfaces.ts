/**
 * `npm run bench -- surfaces`: what one stream costs the gateway on each surface — REST's SSE,
 * Connect with JSON and with binary messages (HTTP/1.1), and gRPC (h2c) — in front of the bench's
 * fast fake vLLM (./fake-vllm.ts), as the gateway's CPU per stream (/proc, all threads) ÷ streams
 * completed, at 1 token and at `--chunks` tokens (default 16) a stream, so that the two give the
 * fixed part of a stream and the part of each chunk.
 *
 * One gateway (ACS_WORKERS=1, keys off, `--gateway-cmd` or BENCH_GATEWAY_CMD, else as
 * ./hotpath.ts picks it), primed with 3 s of each surface. Then `--rounds` rounds (default 5) of
 * one window per surface (`--duration`, default 3 s), the surfaces' order rotated per round, each
 * with `--connections` streams at once (default 32). The clients run in this process (undici for
 * REST; connect-node's transports for the rest): their CPU is not the gateway's. Reported: the
 * median over the rounds of µs per stream, and its ratio to REST's within each round (median).
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { Agent, request } from "undici";
import { CompletionsService } from "../../gen/acs/v1/completions_pb.js";
import { freePort } from "../../test/helpers/processes.js";
import { median, positive } from "./ab.js";
import { createFakeVllm } from "./fake-vllm.js";
import { gatewayCommand, type SectionOptions } from "./hotpath.js";
import { processCpuSeconds, spawnServer } from "./processes.js";

const MODEL = "bench-model";

/** A surface: one stream of `tokens` tokens, resolving with the chunks of text it got. */
type Surface = (tokens: number) => Promise<number>;

function surfaces(url: string): {
  names: string[];
  run: Record<string, Surface>;
  close: () => Promise<void>;
} {
  const agent = new Agent({ connections: 256 });
  const rest: Surface = async (tokens) => {
    const body = JSON.stringify({ model: MODEL, prompt: "The sky is", max_tokens: tokens, stream: true });
    const res = await request(`${url}/v1/completions`, {
      method: "POST",
      body,
      headers: { "content-type": "application/json" },
      dispatcher: agent,
    });
    const text = await res.body.text();
    if (res.statusCode !== 200 || !text.endsWith("data: [DONE]\n\n"))
      throw new Error(`REST: ${res.statusCode}`);
    return (text.match(/^data: \{/gm) ?? []).length;
  };
  const rpc = (client: Client<typeof CompletionsService>): Surface => {
    return async (tokens) => {
      let chunks = 0;
      const req = { model: MODEL, prompt: { case: "text" as const, value: "The sky is" }, maxTokens: tokens };
      for await (const _ of client.streamCompletion(req)) chunks++;
      return chunks;
    };
  };
  const run: Record<string, Surface> = {
    "REST (SSE)": rest,
    "Connect, JSON (HTTP/1.1)": rpc(
      createClient(
        CompletionsService,
        createConnectTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat: false }),
      ),
    ),
    "Connect, binary (HTTP/1.1)": rpc(
      createClient(
        CompletionsService,
        createConnectTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat: true }),
      ),
    ),
    "gRPC (h2c)": rpc(createClient(CompletionsService, createGrpcTransport({ baseUrl: url }))),
  };
  return { names: Object.keys(run), run, close: () => agent.close() };
}

/** `connections` loops of streams for `seconds`: streams completed (each checked whole). */
async function load(surface: Surface, tokens: number, seconds: number, connections: number) {
  const end = performance.now() + seconds * 1000;
  let streams = 0;
  await Promise.all(
    Array.from({ length: connections }, async () => {
      while (performance.now() < end) {
        const got = await surface(tokens);
        if (got !== tokens) throw new Error(`a stream of ${tokens} tokens gave ${got} chunks`);
        streams++;
      }
    }),
  );
  return { streams };
}

export async function benchSurfaces(options: SectionOptions = {}): Promise<string> {
  const rounds = positive(options, "rounds", 5);
  const seconds = positive(options, "duration", 3);
  const connections = positive(options, "connections", 32);
  const chunks = positive(options, "chunks", 16);
  const cmd = options["gateway-cmd"];
  const gateway = gatewayCommand(typeof cmd === "string" ? cmd : process.env.BENCH_GATEWAY_CMD);

  const fake = createFakeVllm({ model: MODEL, chunks });
  await new Promise<void>((resolve) => fake.listen(0, "127.0.0.1", resolve));
  const dir = mkdtempSync(join(tmpdir(), "acs-surfaces-"));
  const models = join(dir, "models.json");
  const fakeUrl = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  writeFileSync(
    models,
    JSON.stringify({
      models: [
        {
          id: MODEL,
          upstream_url: fakeUrl,
          hidden_size: 4096,
          num_hidden_layers: 32,
          byte_level_tokenizer: true,
        },
      ],
    }),
  );
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const server = await spawnServer("acs-gateway", gateway.argv, {
    env: { ACS_MODELS: models, ACS_WORKERS: "1", PORT: String(port), ACS_LOG_LEVEL: "warn" },
    url,
    readyPath: "/readyz",
  });
  const clients = surfaces(url);
  try {
    for (const name of clients.names) await load(clients.run[name] as Surface, chunks, 3, connections);
    const rows: string[] = [];
    for (const tokens of [1, chunks]) {
      const perStream = new Map<string, number[]>(clients.names.map((n) => [n, []]));
      const vsRest = new Map<string, number[]>(clients.names.map((n) => [n, []]));
      for (let round = 0; round < rounds; round++) {
        const order = clients.names.map(
          (_, i) => clients.names[(i + round) % clients.names.length] as string,
        );
        const inRound = new Map<string, number>();
        for (const name of order) {
          const before = processCpuSeconds(server.pid);
          const { streams } = await load(clients.run[name] as Surface, tokens, seconds, connections);
          const us = ((processCpuSeconds(server.pid) - before) * 1e6) / streams;
          inRound.set(name, us);
          perStream.get(name)?.push(us);
        }
        const rest = inRound.get(clients.names[0] as string) as number;
        for (const name of clients.names) vsRest.get(name)?.push((inRound.get(name) as number) / rest);
      }
      for (const name of clients.names) {
        const us = median(perStream.get(name) as number[]);
        rows.push(
          `| ${name} | ${tokens} | ${us.toFixed(0)} | ${(us / tokens).toFixed(1)} | ${median(vsRest.get(name) as number[]).toFixed(2)} |`,
        );
      }
    }
    return [
      "## Surfaces: what a stream costs the gateway on REST, Connect and gRPC",
      "",
      `One gateway (\`${gateway.label}\`, ACS_WORKERS=1, keys off) in front of the bench's fake vLLM; ${connections} streams at once from clients in the bench's own process; ${rounds} rounds of ${seconds} s per surface, the order rotated per round; medians over the rounds. CPU = the gateway's (/proc, all threads) ÷ streams completed.`,
      "",
      "| surface | tokens a stream | gateway CPU µs per stream | per token | × REST (same round) |",
      "|---|---:|---:|---:|---:|",
      ...rows,
    ].join("\n");
  } finally {
    await clients.close();
    await server.stop();
    await new Promise<void>((resolve) => fake.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  }
}
