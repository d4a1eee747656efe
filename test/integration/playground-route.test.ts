// GET /playground over HTTP (no browser): the built page and its assets with their types and a
// CSP of 'self' only, the gateway's 404 envelope for anything else under /playground/, and a
// 404 saying that ACS_PLAYGROUND_DIR's folder holds no page; the pages counted as protocol="page".
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { request as httpRequest } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defaultPlaygroundDir } from "../../src/surfaces/http/playground-routes.js";
import { buildPlayground } from "../helpers/build-playground.js";
import { until } from "../helpers/hang-guard.js";
import { metricSeries } from "../helpers/metrics.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

describe("GET /playground", () => {
  let dir: string;
  let empty: string;
  let built: Stack;
  let unbuilt: Stack;

  beforeAll(async () => {
    dir = await buildPlayground();
    empty = await mkdtemp(join(tmpdir(), "acs-playground-empty-"));
    built = await startStack({ playgroundDir: dir });
    unbuilt = await startStack({ playgroundDir: empty });
  });

  afterAll(async () => {
    await built?.close();
    await unbuilt?.close();
    for (const d of [dir, empty]) if (d) await rm(d, { recursive: true, force: true });
  });

  it("answers the built page at /playground and /playground/, with a CSP of 'self' only", async () => {
    for (const path of ["/playground", "/playground/"]) {
      const response = await fetch(`${built.url}${path}`);
      expect(response.status).toBe(200);
      expect(response.headers.get("content-type")).toBe("text/html; charset=utf-8");
      expect(response.headers.get("content-security-policy")).toContain("default-src 'self'");
      expect(response.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
      const html = await response.text();
      expect(html).toContain("<title>acs-gateway playground</title>");
      // Every script and stylesheet is the gateway's own: no other origin, no CDN.
      const refs = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
      expect(refs.length).toBeGreaterThanOrEqual(2);
      // (The icon is an empty data: URL, so that the browser asks for no /favicon.ico.)
      for (const ref of refs) expect(ref).toMatch(/^(?:\/playground\/assets\/|data:,$)/);
    }
    const head = await fetch(`${built.url}/playground`, { method: "HEAD" });
    expect(head.status).toBe(200);
  });

  it("serves each asset vite wrote, with its type", async () => {
    const assets = await readdir(join(dir, "assets"));
    expect(assets.some((a) => a.endsWith(".js"))).toBe(true);
    for (const asset of assets) {
      const response = await fetch(`${built.url}/playground/assets/${asset}`);
      expect(response.status).toBe(200);
      const type = response.headers.get("content-type");
      if (asset.endsWith(".js")) expect(type).toBe("application/javascript; charset=utf-8");
      if (asset.endsWith(".css")) expect(type).toBe("text/css; charset=utf-8");
      // The bundle carries the page's code (fzstd and eventsource-parser included), nothing fetched later.
      if (asset.endsWith(".js")) expect(await response.text()).toContain("acs-playground-api-key");
    }
  });

  it("answers anything else under /playground/ with the gateway's 404 envelope", async () => {
    for (const path of [
      "/playground/nope.js",
      "/playground/%2e%2e/package.json",
      "/playground/../package.json",
    ]) {
      const response = await fetch(`${built.url}${path}`);
      expect(response.status).toBe(404);
      const body = (await response.json()) as { error: { code: string }; request_id: string };
      expect(body.error.code).toBe("unknown_route");
      expect(body.request_id).toBe(response.headers.get("x-request-id"));
    }
  });

  it("answers another method on the page or its assets with 405 and Allow: GET, HEAD", async () => {
    const [asset] = await readdir(join(dir, "assets"));
    for (const [method, path] of [
      ["POST", "/playground"],
      ["PUT", "/playground/"],
      ["DELETE", `/playground/assets/${asset}`],
      ["POST", "/playground/nope.js"],
    ] as const) {
      const response = await fetch(`${built.url}${path}`, { method });
      expect(response.status, `${method} ${path}`).toBe(405);
      expect(response.headers.get("allow")).toBe("GET, HEAD");
      const body = (await response.json()) as { error: { code: string; type: string }; request_id: string };
      expect(body.error.code).toBe("method_not_allowed");
      expect(body.request_id).toBe(response.headers.get("x-request-id"));
    }
    // Not the page: still 404.
    expect((await fetch(`${built.url}/playgroundx`, { method: "POST" })).status).toBe(404);
  });

  it("answers paths that would leave the page's folder with the 404 envelope, never a 500", async () => {
    // Raw paths (fetch would normalise `..` and `%2e%2e` away before sending).
    const raw = (path: string, method = "GET") =>
      new Promise<{ status: number; body: string; id: string | undefined }>((resolve, reject) => {
        const req = httpRequest(`${built.url}/`, { method, path }, (res) => {
          let body = "";
          res.setEncoding("utf8").on("data", (d: string) => {
            body += d;
          });
          res.on("end", () =>
            resolve({
              status: res.statusCode ?? 0,
              body,
              id: res.headers["x-request-id"] as string | undefined,
            }),
          );
        });
        req.on("error", reject).end();
      });
    for (const path of [
      "/playground/..",
      "/playground/../package.json",
      "/playground/%2e%2e/package.json",
      "/playground//etc/passwd",
      "/playground/a%00b",
      "/playground/assets/..%5c..%5cpackage.json",
    ]) {
      const response = await raw(path);
      expect(response.status, path).toBe(404);
      const body = JSON.parse(response.body) as { error: { code: string }; request_id: string };
      expect(body.error.code, path).toBe("unknown_route");
      expect(body.request_id).toBe(response.id);
      expect(response.body).not.toContain('"name"'); // not package.json
    }
  });

  it('counts the pages (playground, API reference, OpenAPI document) as protocol="page", ops routes as "ops"', async () => {
    const [asset] = await readdir(join(dir, "assets"));
    const pages = ["/playground", "/playground/", `/playground/assets/${asset}`, "/docs", "/openapi.json"];
    for (const path of [...pages, "/healthz"]) {
      const response = await fetch(`${built.url}${path}`);
      expect(response.status, path).toBe(200);
      await response.arrayBuffer();
    }
    // Each request is counted once its response has ended (the access log's moment).
    const byProtocol = async () => {
      const out = new Map<string, string[]>();
      for (const labels of (await metricSeries(built.url, "acs_requests_total")).keys()) {
        const protocol = /protocol="([^"]*)"/.exec(labels)?.[1] ?? "";
        const route = /route="([^"]*)"/.exec(labels)?.[1] ?? "";
        out.set(protocol, [...(out.get(protocol) ?? []), route]);
      }
      return out;
    };
    // /healthz came last: counted, so are the pages before it.
    await until(async () => {
      const counted = await byProtocol();
      return [...counted.values()].some((routes) => routes.includes("/healthz"));
    }, "the requests are counted");
    const counted = await byProtocol();
    // ("unknown": the earlier tests' 404s and 405s under /playground/, pages too.)
    for (const route of counted.get("page") ?? []) {
      expect(route).toMatch(/^(\/(playground|docs|openapi\.json)|unknown$)/);
    }
    const pageRoutes = new Set(counted.get("page"));
    for (const route of ["/docs", "/openapi.json"]) expect(pageRoutes).toContain(route);
    expect([...pageRoutes].filter((r) => r.startsWith("/playground")).length).toBeGreaterThan(0);
    expect(counted.get("ops") ?? []).toContain("/healthz");
    for (const route of counted.get("ops") ?? []) expect(route).not.toMatch(/^\/(playground|docs|openapi)/);
  });

  it("says that ACS_PLAYGROUND_DIR holds no page when its folder has none", async () => {
    for (const path of ["/playground", "/playground/assets/index.js"]) {
      const response = await fetch(`${unbuilt.url}${path}`);
      expect(response.status).toBe(404);
      const body = (await response.json()) as { error: { message: string; code: string } };
      expect(body.error.code).toBe("unknown_route");
      expect(body.error.message).toBe(
        `The playground page is not in ACS_PLAYGROUND_DIR (${empty} has no index.html): point it at a built copy (\`npm run build:playground\` writes ${defaultPlaygroundDir()}).`,
      );
    }
  });
});
