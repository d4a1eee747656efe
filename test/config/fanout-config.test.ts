import { describe, expect, it } from "vitest";
import { limits, loadConfig } from "../../src/config/index.js";

describe("loadConfig: ACS_FANOUT_CONCURRENCY (Inference requests one lens fan-out runs at once)", () => {
  it("defaults to 8", () => {
    expect(loadConfig({}).lensFanOutConcurrency).toBe(8);
    expect(limits.lensFanOutConcurrency).toBe(8);
  });

  it("is read from the environment", () => {
    expect(loadConfig({ ACS_FANOUT_CONCURRENCY: "3" }).lensFanOutConcurrency).toBe(3);
  });

  it.each(["0", "-1", "1.5", "lots", "4097"])("refuses %j", (value) => {
    expect(() => loadConfig({ ACS_FANOUT_CONCURRENCY: value })).toThrow(/ACS_FANOUT_CONCURRENCY must be/);
  });
});
