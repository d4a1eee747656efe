/**
 * The floors of the hot-path benchmark's cost-by-layer table: the least a Node server does for one
 * completion request. `POST /v1/completions` reads the body, parses it as JSON (400 when it is not)
 * and answers one fixed non-stream completion (the text of {@link fakeCompletionText}, `chunks`
 * tokens); any other route is 404. Two frameworks, the same work:
 * - `http`: node:http alone;
 * - `fastify`: fastify (logger off, its own JSON body parser), one route.
 * The difference between the two is what fastify itself costs per request.
 *
 * CLI: `node --import tsx bench/hotpath/floor-server.ts --framework http|fastify [--port 0]
 * [--chunks 16] [--exit-with-stdin]`; prints `floor-<framework> listening at http://127.0.0.1:PORT`.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import Fastify, { type FastifyInstance } from "fastify";
import { fakeCompletionText } from "./fake-vllm.js";

/** The framework a floor server runs on. */
export type FloorFramework = "http" | "fastify";

/** The fixed answer: a vLLM-shaped non-stream completion of `chunks` tokens, as JSON text. */
export function floorAnswer(chunks: number): string {
  return JSON.stringify({
    id: "cmpl-floor",
    object: "text_completion",
    created: 0,
    model: "bench-model",
    choices: [
      {
        index: 0,
        text: fakeCompletionText(chunks),
        logprobs: null,
        finish_reason: "length",
        stop_reason: null,
        prompt_logprobs: null,
      },
    ],
    usage: { prompt_tokens: 4, total_tokens: 4 + chunks, completion_tokens: chunks },
  });
}

/** A floor server on node:http (not listening yet). */
export function createHttpFloor(chunks = 16): Server {
  const answer = floorAnswer(chunks);
  const length = Buffer.byteLength(answer);
  return createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on("data", (d: Buffer) => parts.push(d));
    req.on("end", () => {
      if (req.method !== "POST" || req.url !== "/v1/completions") {
        res.writeHead(404, { "content-type": "text/plain" }).end("not found");
        return;
      }
      try {
        JSON.parse(Buffer.concat(parts).toString("utf8"));
      } catch {
        res.writeHead(400, { "content-type": "text/plain" }).end("not JSON");
        return;
      }
      res.writeHead(200, { "content-type": "application/json", "content-length": length }).end(answer);
    });
  });
}

/** A floor server on fastify (not listening yet). */
export function createFastifyFloor(chunks = 16): FastifyInstance {
  const answer = floorAnswer(chunks);
  const app = Fastify({ logger: false });
  app.post("/v1/completions", async (_request, reply) => reply.type("application/json").send(answer));
  return app;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      framework: { type: "string" },
      port: { type: "string", default: "0" },
      chunks: { type: "string", default: "16" },
      "exit-with-stdin": { type: "boolean", default: false },
    },
  });
  const framework = values.framework;
  if (framework !== "http" && framework !== "fastify") {
    console.error("floor-server: --framework http|fastify is required");
    process.exit(2);
  }
  const chunks = Number(values.chunks);
  const port = Number(values.port);
  let bound: number;
  if (framework === "http") {
    const server = createHttpFloor(chunks);
    await new Promise<void>((r) => server.listen(port, "127.0.0.1", r));
    bound = (server.address() as AddressInfo).port;
  } else {
    const app = createFastifyFloor(chunks);
    await app.listen({ port, host: "127.0.0.1" });
    bound = (app.server.address() as AddressInfo).port;
  }
  process.stdout.write(`floor-${framework} listening at http://127.0.0.1:${bound}\n`);
  if (values["exit-with-stdin"]) {
    process.stdin.on("close", () => process.exit(0));
    process.stdin.resume();
  }
  process.on("SIGTERM", () => process.exit(0));
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
