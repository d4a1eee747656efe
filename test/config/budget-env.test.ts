// The environment of the Budget ledger: ACS_DB selects the store (a postgres:// URL or a SQLite
// path), and the replica settings.
import { describe, expect, it } from "vitest";
import { loadConfig, parseBudgetDb } from "../../src/config/index.js";

describe("ACS_DB", () => {
  it.each([
    [
      "postgres://postgres@127.0.0.1:5432/acs",
      { kind: "postgres", url: "postgres://postgres@127.0.0.1:5432/acs" },
    ],
    [
      "postgresql://u:p@db.internal/acs?sslmode=require",
      { kind: "postgres", url: "postgresql://u:p@db.internal/acs?sslmode=require" },
    ],
    ["POSTGRES://h/acs", { kind: "postgres", url: "POSTGRES://h/acs" }],
    ["./acs.db", { kind: "sqlite", path: "./acs.db" }],
    ["/var/lib/acs/budget.db", { kind: "sqlite", path: "/var/lib/acs/budget.db" }],
    ["postgres.db", { kind: "sqlite", path: "postgres.db" }],
  ])("%s → %o", (value, db) => {
    expect(parseBudgetDb(value)).toEqual(db);
  });

  it("is off when unset or empty, and refuses a postgres URL that does not parse", () => {
    expect(parseBudgetDb(undefined)).toBeUndefined();
    expect(parseBudgetDb("")).toBeUndefined();
    expect(() => parseBudgetDb("postgres://[bad")).toThrow(/ACS_DB is not a valid postgres:\/\/ URL/);
  });
});

describe("replica settings", () => {
  it("reads ACS_INSTANCE_ID, ACS_LEASE_TTL_MS and ACS_HOLD_RENEW_MS, with their defaults", () => {
    const defaults = loadConfig({ ACS_DB: "postgres://h/acs" });
    expect(defaults).toMatchObject({
      db: { kind: "postgres", url: "postgres://h/acs" },
      instanceId: undefined,
      leaseTtlMs: 30_000,
      holdRenewMs: 10_000,
    });
    const set = loadConfig({
      ACS_DB: "postgres://h/acs",
      ACS_INSTANCE_ID: "gw-1",
      ACS_LEASE_TTL_MS: "5000",
      ACS_HOLD_RENEW_MS: "250",
    });
    expect(set).toMatchObject({ instanceId: "gw-1", leaseTtlMs: 5000, holdRenewMs: 250 });
    expect(() => loadConfig({ ACS_LEASE_TTL_MS: "10" })).toThrow(
      /ACS_LEASE_TTL_MS must be in \[1000, 3600000\]/,
    );
    expect(() => loadConfig({ ACS_HOLD_RENEW_MS: "soon" })).toThrow(/ACS_HOLD_RENEW_MS must be an integer/);
  });

  it("binds beyond loopback only with a keys database, PostgreSQL included", () => {
    expect(() => loadConfig({ HOST: "0.0.0.0" })).toThrow(/set ACS_DB/);
    expect(loadConfig({ HOST: "0.0.0.0", ACS_DB: "postgres://h/acs" }).host).toBe("0.0.0.0");
  });
});
