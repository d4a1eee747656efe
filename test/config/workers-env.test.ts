// ACS_WORKERS: the gateway's processes on one port (src/app/cluster/).
import { availableParallelism } from "node:os";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.js";

describe("ACS_WORKERS", () => {
  it("defaults to the cores available and reads a count from 1 to 1024", () => {
    expect(loadConfig({}).workers).toBe(availableParallelism());
    expect(loadConfig({ ACS_WORKERS: "1" }).workers).toBe(1);
    expect(loadConfig({ ACS_WORKERS: "3" }).workers).toBe(3);
  });

  it("refuses 0, a count above 1024 and words, naming the variable", () => {
    expect(() => loadConfig({ ACS_WORKERS: "0" })).toThrow(/ACS_WORKERS must be in \[1, 1024\], got 0/);
    expect(() => loadConfig({ ACS_WORKERS: "1025" })).toThrow(/ACS_WORKERS must be in \[1, 1024\]/);
    expect(() => loadConfig({ ACS_WORKERS: "all" })).toThrow(/ACS_WORKERS must be an integer/);
  });
});
