// Builds the playground page (src/playground) into dist/playground, served by the gateway at
// GET /playground (src/surfaces/http/playground-routes.ts). Every asset is bundled from npm packages.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

const here = fileURLToPath(new URL(".", import.meta.url));

export default defineConfig({
  root: here,
  base: "/playground/",
  logLevel: "warn",
  build: {
    outDir: fileURLToPath(new URL("../../dist/playground", import.meta.url)),
    emptyOutDir: true,
    target: "es2022",
    // No source maps served: the page's sources are in the repository (src/playground).
    sourcemap: false,
  },
});
