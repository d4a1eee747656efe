// GET /openapi.json serves the document, GET /docs renders it: Swagger UI from the gateway itself,
// checked in a real headless chromium (Debian's, driven by playwright-core) — the page shows
// /v1/completions and no request leaves the gateway.
import { Validator } from "@seriousme/openapi-schema-validator";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openApiDocument } from "../../src/surfaces/rest/openapi.js";
import { chromiumUnavailable, launchChromium, skipBrowserTests } from "../helpers/browser.js";
import { until } from "../helpers/hang-guard.js";
import { assertConforming, checkedFetch } from "../helpers/openapi-check.js";
import { type Stack, startStack } from "../helpers/start-stack.js";

let stack: Stack;
beforeAll(async () => {
  stack = await startStack();
});
afterAll(async () => {
  await stack.close();
});
afterEach(assertConforming);

describe("GET /openapi.json and GET /docs", () => {
  it("/openapi.json is the document, valid OpenAPI 3.1, with X-Request-Id", async () => {
    const res = await checkedFetch(`${stack.url}/openapi.json`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/json; charset=utf-8");
    expect(res.headers.get("x-request-id")).toMatch(/^req_[0-9a-f]{32}$/);
    const served = (await res.json()) as unknown;
    expect(served).toStrictEqual(JSON.parse(JSON.stringify(openApiDocument)));
    const result = await new Validator().validate(served as Parameters<Validator["validate"]>[0]);
    expect(result.valid).toBe(true);
  });

  it("/docs is an HTML page that loads only the gateway's own assets, under a same-origin CSP", async () => {
    const res = await checkedFetch(`${stack.url}/docs`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(res.headers.get("content-security-policy")).toContain("default-src 'self'");
    const html = await res.text();
    const sources = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]);
    expect(sources).toStrictEqual([
      "/docs/favicon-32x32.png",
      "/docs/swagger-ui.css",
      "/openapi.json",
      "/docs/swagger-ui-bundle.js",
      "/docs/init.js",
    ]);
    for (const [path, type] of [
      ["/docs/swagger-ui.css", "text/css; charset=utf-8"],
      ["/docs/swagger-ui-bundle.js", "text/javascript; charset=utf-8"],
      ["/docs/init.js", "text/javascript; charset=utf-8"],
      ["/docs/favicon-32x32.png", "image/png"],
    ] as const) {
      const asset = await fetch(`${stack.url}${path}`);
      expect(asset.status, path).toBe(200);
      expect(asset.headers.get("content-type"), path).toBe(type);
      expect((await asset.arrayBuffer()).byteLength, path).toBeGreaterThan(0);
    }
  });

  it("other methods are 405 with Allow; other files under /docs are 404 (no path reaches the disk)", async () => {
    const post = await checkedFetch(`${stack.url}/openapi.json`, { method: "POST" });
    expect(post.status).toBe(405);
    expect(post.headers.get("allow")).toBe("GET, HEAD");
    expect(((await post.json()) as { error: { code: string } }).error.code).toBe("method_not_allowed");
    for (const path of ["/docs/package.json", "/docs/..%2Fpackage.json", "/docs/index.html"]) {
      const res = await checkedFetch(`${stack.url}${path}`);
      expect(res.status, path).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("unknown_route");
    }
  });
});

describe.skipIf(skipBrowserTests())(
  `GET /docs in headless chromium${chromiumUnavailable() ? " (skipped: no chromium)" : ""}`,
  () => {
    it("renders /v1/completions and the other operations; no request leaves the gateway", async () => {
      const browser = await launchChromium();
      try {
        const page = await browser.newPage();
        const requested: string[] = [];
        const failed: string[] = [];
        page.on("request", (request) => requested.push(request.url()));
        page.on("requestfailed", (request) =>
          failed.push(`${request.url()}: ${request.failure()?.errorText}`),
        );
        const errors: string[] = [];
        page.on("pageerror", (err) => errors.push(err.message));
        page.on("console", (message) => {
          if (message.type() === "error") errors.push(message.text());
        });
        const response = await page.goto(`${stack.url}/docs`, { timeout: 0 });
        expect(response?.status()).toBe(200);
        const summary = page.locator('.opblock-summary-path[data-path="/v1/completions"]');
        await until(async () => (await summary.count()) > 0, "Swagger UI renders POST /v1/completions");
        expect(await summary.first().textContent()).toContain("/v1/completions");
        for (const path of ["/v1/models", "/v1/models/{model}"]) {
          expect(await page.locator(`.opblock-summary-path[data-path="${path}"]`).count(), path).toBe(1);
        }
        expect(await page.locator(".info .title").first().textContent()).toContain("acs-gateway REST API");
        // Every request the page made went to the gateway, and none failed.
        expect(requested.length).toBeGreaterThan(0);
        expect(requested.filter((url) => !url.startsWith(`${stack.url}/`))).toStrictEqual([]);
        expect(requested).toContain(`${stack.url}/openapi.json`);
        expect(failed).toStrictEqual([]);
        expect(errors).toStrictEqual([]);
      } finally {
        await browser.close();
      }
    });
  },
);
