/**
 * The bare proxy of the hot-path benchmark: the least a Node proxy can do in front of vLLM. Every
 * request is forwarded to one upstream with undici (`Pool.stream`), bodies piped both ways, nothing
 * parsed; hop-by-hop headers (RFC 9110 §7.6.1) are dropped. The pool admits as many upstream
 * connections as the gateway's (128), so both queue alike above 128 concurrent streams. An upstream
 * failure before the answer started is a bare 502; after it, the client connection is cut. A client
 * that goes away aborts the upstream request. `GET /healthz` is answered by the proxy itself (200).
 *
 * CLI: `node --import tsx bench/hotpath/bare-proxy.ts --upstream http://127.0.0.1:PORT [--port 0]
 * [--connections 128] [--exit-with-stdin]`; prints `bare-proxy listening at http://127.0.0.1:PORT`.
 */
import { createServer, type IncomingHttpHeaders, type OutgoingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { Pool } from "undici";

const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "host",
]);

function endToEnd(headers: IncomingHttpHeaders | Record<string, string | string[] | undefined>) {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) out[k] = v;
  return out;
}

/** A pass-through proxy to `upstream` (an origin such as `http://127.0.0.1:8000`). */
export function createBareProxy(upstream: string, connections = 128): { server: Server; pool: Pool } {
  const pool = new Pool(upstream, { connections, headersTimeout: 900_000, bodyTimeout: 900_000 });
  const server = createServer((req, res) => {
    // Its own liveness route, answered here as the gateway answers its own: the streams bench
    // probes both while they relay streams.
    if (req.url === "/healthz") {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end("ok");
      return;
    }
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    const hasBody = req.method !== "GET" && req.method !== "HEAD";
    pool.stream(
      {
        method: req.method as "GET",
        path: req.url ?? "/",
        headers: endToEnd(req.headers) as Record<string, string>,
        body: hasBody ? req : null,
        signal: abort.signal,
      },
      ({ statusCode, headers }) => {
        res.writeHead(statusCode, endToEnd(headers));
        return res;
      },
      (err) => {
        if (err === null) return;
        if (!res.headersSent) {
          res.writeHead(502, { "content-length": 0 });
          res.end();
        } else res.destroy();
      },
    );
  });
  return { server, pool };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      upstream: { type: "string" },
      port: { type: "string", default: "0" },
      connections: { type: "string", default: "128" },
      "exit-with-stdin": { type: "boolean", default: false },
    },
  });
  if (values.upstream === undefined) {
    console.error("bare-proxy: --upstream URL is required");
    process.exit(2);
  }
  const { server } = createBareProxy(values.upstream, Number(values.connections));
  await new Promise<void>((r) => server.listen(Number(values.port), "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`bare-proxy listening at http://127.0.0.1:${port}\n`);
  if (values["exit-with-stdin"]) {
    process.stdin.on("close", () => process.exit(0));
    process.stdin.resume();
  }
  process.on("SIGTERM", () => process.exit(0));
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
