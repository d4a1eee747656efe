// GET /playground: the playground page (src/playground), built by vite into a folder of static
// files (`npm run build:playground` → dist/playground) and served from it by @fastify/static.
// The page loads nothing from other origins: its Content-Security-Policy allows 'self' only.
import { existsSync } from "node:fs";
import { join } from "node:path";
import fastifyStatic from "@fastify/static";
import type { FastifyInstance, FastifyReply } from "fastify";
import { ApiError } from "../../core/errors/index.js";
import { requestIdOf, sendError, unknownRoute } from "../rest/index.js";
import { packageRoot } from "./package-root.js";

/** Where the playground page lives in a URL: /playground and /playground/… */
export const PLAYGROUND_PATH = "/playground";

/**
 * The page's Content-Security-Policy: scripts, styles, fetches and images from the gateway itself
 * (images also as data: and blob: URLs), no frames, no plugins.
 */
export const PLAYGROUND_CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data: blob:; " +
  "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'";

/** dist/playground of the package this module belongs to (the folder above src/ or dist/src/ holding package.json). */
export function defaultPlaygroundDir(): string {
  return join(packageRoot(), "dist", "playground");
}

function withPageHeaders(reply: FastifyReply): FastifyReply {
  return reply
    .header("content-security-policy", PLAYGROUND_CSP)
    .header("x-content-type-options", "nosniff")
    .header("referrer-policy", "no-referrer");
}

/**
 * Serves the built page of `dir`: GET /playground and /playground/ answer its index.html, GET
 * /playground/<file> its assets (vite's hashed names). A folder without index.html answers 404
 * `unknown_route` saying what to do: the command that builds the default folder (dist/playground),
 * or, for another folder (ACS_PLAYGROUND_DIR), to point it at a built copy. A missing asset is
 * the gateway's usual 404 envelope.
 */
export async function playgroundRoutes(app: FastifyInstance, options: { dir: string }): Promise<void> {
  const { dir } = options;
  if (!existsSync(join(dir, "index.html"))) {
    // `npm run build:playground` writes the default folder only: a folder of ACS_PLAYGROUND_DIR
    // must be a built copy.
    const message =
      dir === defaultPlaygroundDir()
        ? `The playground page is not built: run \`npm run build:playground\` (it writes ${dir}), or set ACS_PLAYGROUND_DIR to a built copy.`
        : `The playground page is not in ACS_PLAYGROUND_DIR (${dir} has no index.html): point it at a built copy (\`npm run build:playground\` writes ${defaultPlaygroundDir()}).`;
    const notBuilt = (_request: unknown, reply: FastifyReply) =>
      sendError(reply, new ApiError("unknown_route", message), requestIdOf(reply));
    app.get(PLAYGROUND_PATH, notBuilt);
    app.get(`${PLAYGROUND_PATH}/*`, notBuilt);
    return;
  }
  // @fastify/static refuses a path that leaves `dir` (`..`, NUL, a doubled slash) with its own 403
  // error: to a caller it is a file the page does not have, the usual 404 envelope (and no stack
  // in the log). Other errors go on to the server's handler.
  app.setErrorHandler((err: { code?: unknown; statusCode?: unknown }, request, reply) => {
    if (err.code === "FST_STATIC_FORBIDDEN_PATH" || err.statusCode === 403 || err.statusCode === 404) {
      return sendError(reply, unknownRoute(request), requestIdOf(reply));
    }
    throw err;
  });
  await app.register(fastifyStatic, {
    root: dir,
    prefix: `${PLAYGROUND_PATH}/`,
    index: "index.html",
    dotfiles: "ignore",
    setHeaders: (reply) => {
      withPageHeaders(reply);
    },
  });
  app.get(PLAYGROUND_PATH, async (_request, reply) => withPageHeaders(reply).sendFile("index.html"));
}
