// ACS_LOG_FORMAT: JSON lines by default, pino-pretty's text with `pretty`.
import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../src/telemetry/index.js";
import { until } from "../helpers/hang-guard.js";

function capture() {
  const chunks: string[] = [];
  const destination = new Writable({
    write(chunk, _encoding, done) {
      chunks.push(String(chunk));
      done();
    },
  });
  return { chunks, destination };
}

describe("createLogger", () => {
  it("json: one JSON object a line, named acs-gateway", () => {
    const { chunks, destination } = capture();
    createLogger({ level: "info", format: "json", destination }).info({ requestId: "r1" }, "request");
    const line = JSON.parse(chunks.join("")) as Record<string, unknown>;
    expect(line).toMatchObject({ level: 30, name: "acs-gateway", requestId: "r1", msg: "request" });
  });

  it("pretty: a line for people (level name, message, fields), not JSON; the level applies", async () => {
    const { chunks, destination } = capture();
    const logger = createLogger({ level: "info", format: "pretty", destination });
    logger.debug("hidden");
    logger.info({ requestId: "r2", status: 200 }, "request");
    await until(() => chunks.join("").includes("request"), "the pretty line");
    const text = chunks.join("");
    expect(() => JSON.parse(text)).toThrow();
    expect(text).toContain("INFO");
    expect(text).toContain("request");
    expect(text).toContain('requestId: "r2"');
    expect(text).not.toContain("hidden");
  });
});
