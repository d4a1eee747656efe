import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    pool: "forks",
    // Probes PostgreSQL once: its tests run, are skipped with the reason, or (ACS_TEST_POSTGRES=required) fail.
    globalSetup: ["test/global-setup.ts"],
  },
});
