import { describe, expect, it } from "vitest";
import { limits, loadConfig } from "../../src/config/index.js";

describe("loadConfig: the steering budget's bounds", () => {
  it("default to 32 MiB per request and 256 MiB in all", () => {
    const config = loadConfig({});
    expect(config.steeringRequestBytes).toBe(2 ** 25);
    expect(config.steeringProcessBytes).toBe(2 ** 28);
    expect([limits.steeringRequestBytes, limits.steeringProcessBytes]).toEqual([2 ** 25, 2 ** 28]);
  });

  it("are read from ACS_STEERING_REQUEST_BYTES and ACS_STEERING_PROCESS_BYTES", () => {
    const config = loadConfig({
      ACS_STEERING_REQUEST_BYTES: "1048576",
      ACS_STEERING_PROCESS_BYTES: "4194304",
    });
    expect([config.steeringRequestBytes, config.steeringProcessBytes]).toEqual([1048576, 4194304]);
  });

  it.each(["0", "-1", "1.5", "lots"])("refuse %j", (value) => {
    expect(() => loadConfig({ ACS_STEERING_PROCESS_BYTES: value })).toThrow(
      /ACS_STEERING_PROCESS_BYTES must be/,
    );
  });
});
