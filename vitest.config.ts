import { defineConfig } from "vitest/config";
import { HANG_GUARD_MS } from "./test/helpers/hang-guard.js";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Hang guards only: no test depends on finishing within a time (see test/helpers/hang-guard.ts).
    testTimeout: HANG_GUARD_MS,
    hookTimeout: HANG_GUARD_MS,
    pool: "forks",
    // Probes PostgreSQL once: its tests run, are skipped with the reason, or (ACS_TEST_POSTGRES=required) fail.
    globalSetup: ["test/global-setup.ts"],
  },
});
