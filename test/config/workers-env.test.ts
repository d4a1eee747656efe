// ACS_WORKERS: the gateway's processes on one port (src/server/cluster.ts).
import { availableParallelism } from "node:os";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.js";
import { workersBindOwnSockets } from "../../src/server/cluster.js";

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

  it("workers bind sockets of their own (SO_REUSEPORT) on Linux with Node 22.12+ or 23.1+ only", () => {
    for (const v of ["22.12.0", "22.23.3", "23.1.0", "24.0.0", "25.2.1"]) {
      expect(workersBindOwnSockets("linux", v), v).toBe(true);
    }
    for (const v of ["20.19.2", "22.11.0", "23.0.0", "18.20.0"]) {
      expect(workersBindOwnSockets("linux", v), v).toBe(false);
    }
    expect(workersBindOwnSockets("darwin", "22.23.3")).toBe(false);
    expect(workersBindOwnSockets("win32", "24.0.0")).toBe(false);
  });
});
