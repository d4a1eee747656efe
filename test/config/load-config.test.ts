// The environment against its schema: defaults, and one line naming the variable for each mistake.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config/index.js";

const dir = mkdtempSync(join(tmpdir(), "acs-config-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function refusal(env: Record<string, string>): string {
  try {
    loadConfig(env);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message).not.toContain("\n");
    return (err as Error).message;
  }
  throw new Error("loadConfig accepted it");
}

describe("loadConfig", () => {
  it("has the documented defaults, and ignores variables it does not read", () => {
    const config = loadConfig({ ACS_API_KEY: "a client's key", PATH: "/bin", ACS_DB: "" });
    expect(config).toMatchObject({
      host: "127.0.0.1",
      port: 8080,
      opsPort: undefined,
      models: [],
      modelsPath: undefined,
      embeddedEngine: { preset: "llama-8b", aliases: ["llama-8b"] },
      db: undefined,
      instanceId: undefined,
      leaseTtlMs: 30_000,
      holdRenewMs: 10_000,
      keepaliveIntervalMs: 5000,
      nonStreamDeadlineMs: 840_000,
      logLevel: "info",
      drainDelayMs: 5000,
      shutdownGraceMs: 20_000,
      logFormat: "json",
      otlpEndpoint: undefined,
      workerTimeoutMs: 30_000,
    });
    expect(Object.isFrozen(config)).toBe(true);
  });

  it("reads ACS_LOG_FORMAT and the OTLP endpoint (the traces one first), and refuses bad values", () => {
    const config = loadConfig({
      ACS_LOG_FORMAT: "pretty",
      OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318",
    });
    expect(config.logFormat).toBe("pretty");
    expect(config.otlpEndpoint).toBe("http://127.0.0.1:4318/v1/traces");
    expect(
      loadConfig({
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:4318",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://127.0.0.1:4319/v1/traces",
      }).otlpEndpoint,
    ).toBe("http://127.0.0.1:4319/v1/traces");
    expect(() => loadConfig({ ACS_LOG_FORMAT: "text" })).toThrow(/ACS_LOG_FORMAT.*json or pretty/);
    expect(() => loadConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" })).toThrow(
      /OTEL_EXPORTER_OTLP_ENDPOINT/,
    );
  });

  it("reads the models file ACS_MODELS names", () => {
    const path = join(dir, "models.json");
    writeFileSync(
      path,
      JSON.stringify({
        models: [{ id: "m", upstream_url: "http://a:1", hidden_size: 8, num_hidden_layers: 2 }],
      }),
    );
    const config = loadConfig({ ACS_MODELS: path, PORT: "0", ACS_LOG_LEVEL: "warn" });
    expect([config.models.map((m) => m.id), config.embeddedEngine, config.port, config.logLevel]).toEqual([
      ["m"],
      undefined,
      0,
      "warn",
    ]);
  });

  it.each([
    [
      { ACS_LOG_LEVEL: "loud" },
      'ACS_LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got "loud"',
    ],
    [{ PORT: "http" }, 'PORT must be an integer, got "http"'],
    [{ PORT: "70000" }, "PORT must be in [0, 65535], got 70000"],
    [{ ACS_OPS_PORT: "ops" }, 'ACS_OPS_PORT must be an integer, got "ops"'],
    [{ ACS_OPS_PORT: "8080" }, "ACS_OPS_PORT=8080: the ops port must differ from PORT"],
    [{ PORT: "9000", ACS_OPS_PORT: "9000" }, "ACS_OPS_PORT=9000: the ops port must differ from PORT"],
    [{ ACS_DEADLINE_MS: "5" }, "ACS_DEADLINE_MS must be in [10, 86400000], got 5"],
    [
      { ACS_WORKER_TIMEOUT_MS: "5000" },
      "ACS_WORKER_TIMEOUT_MS must be 0 (never) or in [10000, 3600000], got 5000",
    ],
    [
      { ACS_WORKER_TIMEOUT_MS: "3600001" },
      "ACS_WORKER_TIMEOUT_MS must be 0 (never) or in [10000, 3600000], got 3600001",
    ],
    [{ ACS_WORKER_TIMEOUT_MS: "1m" }, 'ACS_WORKER_TIMEOUT_MS must be an integer, got "1m"'],
    [{ ACS_ENGINE_PRESET: "huge" }, 'ACS_ENGINE_PRESET must be tiny or llama-8b, got "huge"'],
    [{ ACS_DRAIN_DELAY_MS: "-1" }, 'ACS_DRAIN_DELAY_MS must be an integer, got "-1"'],
    [{ ACS_SHUTDOWN_GRACE_MS: "1e3" }, 'ACS_SHUTDOWN_GRACE_MS must be an integer, got "1e3"'],
    [
      { ACS_MODELS: "/no/such/models.json" },
      "ACS_MODELS=/no/such/models.json: cannot read the models file: no such file",
    ],
    [
      { ACS_DB: "/no/such/dir/acs.db" },
      "ACS_DB=/no/such/dir/acs.db: the directory /no/such/dir does not exist",
    ],
    [
      { HOST: "0.0.0.0" },
      "HOST=0.0.0.0 without keys: set ACS_DB to a keys database (npm run keys) before binding beyond loopback",
    ],
  ])("refuses %j: %s", (env, message) => {
    expect(refusal(env)).toBe(message);
  });

  it("takes ACS_WORKER_TIMEOUT_MS: 0 (never) or 10 s to 1 h", () => {
    expect(loadConfig({ ACS_WORKER_TIMEOUT_MS: "0" }).workerTimeoutMs).toBe(0);
    expect(loadConfig({ ACS_WORKER_TIMEOUT_MS: "10000" }).workerTimeoutMs).toBe(10_000);
  });

  it("takes ACS_OPS_PORT beside PORT (0: any free port, also with PORT=0)", () => {
    expect(loadConfig({ ACS_OPS_PORT: "9090" })).toMatchObject({ port: 8080, opsPort: 9090 });
    expect(loadConfig({ PORT: "0", ACS_OPS_PORT: "0" })).toMatchObject({ port: 0, opsPort: 0 });
  });

  it("refuses an ACS_DB that is a directory, or whose directory is a file", () => {
    expect(refusal({ ACS_DB: dir })).toBe(`ACS_DB=${dir}: is a directory, not a file`);
    const file = join(dir, "plain");
    writeFileSync(file, "");
    expect(refusal({ ACS_DB: join(file, "acs.db") })).toBe(
      `ACS_DB=${join(file, "acs.db")}: ${file} is not a directory`,
    );
  });

  it("names every bad variable at once", () => {
    expect(refusal({ PORT: "x", ACS_LOG_LEVEL: "loud" })).toMatch(
      /^PORT must be an integer, got "x"; ACS_LOG_LEVEL must be/,
    );
  });
});
