import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import type { FastifyInstance, FastifyPluginAsync } from "fastify";
import { openApiDocument } from "./openapi.js";

/** The document as served (serialized once). */
const openApiJson = JSON.stringify(openApiDocument);

/**
 * The files of the swagger-ui-dist package the page loads, by the name they are served under
 * (`/docs/<name>`). A fixed list: no path from the request ever reaches the file system.
 */
const assets: Readonly<Record<string, string>> = {
  "swagger-ui.css": "text/css; charset=utf-8",
  "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
  "favicon-32x32.png": "image/png",
};

/** Starts Swagger UI on /openapi.json; no validator badge (it would call a remote validator). */
const initScript = `window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    validatorUrl: null,
    deepLinking: true,
    defaultModelsExpandDepth: 0,
  });
});
`;

const page = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>acs-gateway REST API</title>
<link rel="icon" type="image/png" href="/docs/favicon-32x32.png">
<link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"><noscript>The API reference needs JavaScript; the document itself is <a href="/openapi.json">/openapi.json</a>.</noscript></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
`;

/**
 * The page's Content-Security-Policy: everything from the gateway itself, so the page makes no
 * request elsewhere (Swagger UI's inline styles and data: images allowed).
 */
const contentSecurityPolicy =
  "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; connect-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'self'";

/** The folder of the installed swagger-ui-dist package. */
function swaggerUiDir(): string {
  return dirname(createRequire(import.meta.url).resolve("swagger-ui-dist/package.json"));
}

async function registerDocs(app: FastifyInstance): Promise<void> {
  const dir = swaggerUiDir();
  const cache = new Map<string, Promise<Buffer>>();
  const asset = (name: string): Promise<Buffer> => {
    let read = cache.get(name);
    if (read === undefined) {
      read = readFile(join(dir, name));
      read.catch(() => cache.delete(name));
      cache.set(name, read);
    }
    return read;
  };

  app.get("/openapi.json", async (_request, reply) =>
    reply.type("application/json; charset=utf-8").header("cache-control", "no-cache").send(openApiJson),
  );
  app.get("/docs", async (_request, reply) =>
    reply
      .type("text/html; charset=utf-8")
      .header("content-security-policy", contentSecurityPolicy)
      .header("x-content-type-options", "nosniff")
      .send(page),
  );
  app.get("/docs/init.js", async (_request, reply) =>
    reply.type("text/javascript; charset=utf-8").send(initScript),
  );
  for (const [name, type] of Object.entries(assets)) {
    app.get(`/docs/${name}`, async (_request, reply) =>
      reply
        .type(type)
        .header("cache-control", "public, max-age=3600")
        .header("x-content-type-options", "nosniff")
        .send(await asset(name)),
    );
  }
}

/**
 * `GET /openapi.json` (the OpenAPI 3.1 document of the REST surface, src/surfaces/rest/openapi.ts) and
 * `GET /docs`, the API reference: Swagger UI (the swagger-ui-dist package, served from
 * node_modules by the gateway itself under `/docs/…`; no CDN, no request leaves the gateway)
 * rendering /openapi.json. No key needed. Register inside the REST plugin (its error handler and
 * request ids apply).
 */
export const apiDocsRoutes: FastifyPluginAsync = registerDocs;
