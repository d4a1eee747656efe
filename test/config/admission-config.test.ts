import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.js";

describe("loadConfig: per-key caps and the stream stall timeout", () => {
  it("default to 1024 requests, 512 streams, half a model's capacity per key, and 60 s", () => {
    const config = loadConfig({});
    expect([
      config.maxRequestsPerKey,
      config.maxStreamsPerKey,
      config.maxUpstreamSharePerKey,
      config.streamStallMs,
    ]).toEqual([1024, 512, 0.5, 60_000]);
  });

  it("are read from ACS_MAX_REQUESTS_PER_KEY, ACS_MAX_STREAMS_PER_KEY, ACS_MAX_UPSTREAM_SHARE_PER_KEY and ACS_STREAM_STALL_MS", () => {
    const config = loadConfig({
      ACS_MAX_REQUESTS_PER_KEY: "0",
      ACS_MAX_STREAMS_PER_KEY: "8",
      ACS_MAX_UPSTREAM_SHARE_PER_KEY: "0.25",
      ACS_STREAM_STALL_MS: "1500",
    });
    expect([
      config.maxRequestsPerKey,
      config.maxStreamsPerKey,
      config.maxUpstreamSharePerKey,
      config.streamStallMs,
    ]).toEqual([0, 8, 0.25, 1500]);
    expect(loadConfig({ ACS_MAX_UPSTREAM_SHARE_PER_KEY: "1" }).maxUpstreamSharePerKey).toBe(1);
    expect(loadConfig({ ACS_MAX_UPSTREAM_SHARE_PER_KEY: ".5" }).maxUpstreamSharePerKey).toBe(0.5);
  });

  it.each(["0", "0.0", "1.5", "-0.5", "half", "1e-1", "."])(
    "refuse ACS_MAX_UPSTREAM_SHARE_PER_KEY=%j",
    (value) => {
      expect(() => loadConfig({ ACS_MAX_UPSTREAM_SHARE_PER_KEY: value })).toThrow(
        /ACS_MAX_UPSTREAM_SHARE_PER_KEY must be/,
      );
    },
  );

  it.each([
    ["ACS_MAX_REQUESTS_PER_KEY", "-1"],
    ["ACS_MAX_STREAMS_PER_KEY", "2.5"],
    ["ACS_STREAM_STALL_MS", "5"],
    ["ACS_STREAM_STALL_MS", "soon"],
  ])("refuse %s=%j", (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(`${name} must be`));
  });
});
