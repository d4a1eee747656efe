import { describe, expect, it } from "vitest";
import { generateHoldId } from "../../src/budget/api-key.js";
import {
  apiKeyHint,
  generateApiKey,
  hashApiKey,
  looksLikeApiKey,
  parseAuthorization,
  utcDay,
} from "../../src/budget/index.js";

describe("parseAuthorization", () => {
  it.each([
    [undefined, { kind: "missing" }],
    ["", { kind: "missing" }],
    ["   ", { kind: "missing" }],
    ["Bearer", { kind: "missing" }],
    ["Bearer \t ", { kind: "missing" }],
    ["Bearer abc", { kind: "bearer", token: "abc" }],
    ["bEaReR  abc ", { kind: "bearer", token: "abc" }],
    ["Bearer\tabc", { kind: "bearer", token: "abc" }],
    ["Basic abc", { kind: "wrong_scheme" }],
    ["Bearerabc", { kind: "wrong_scheme" }],
    ["Token abc", { kind: "wrong_scheme" }],
    ["abc", { kind: "wrong_scheme" }],
  ] as const)("%j → %o", (header, parsed) => {
    expect(parseAuthorization(header)).toEqual(parsed);
  });
});

describe("keys", () => {
  it("are acs- + 43 base64url characters, distinct, and hash to 32 bytes", () => {
    const keys = Array.from({ length: 200 }, generateApiKey);
    expect(new Set(keys).size).toBe(200);
    for (const key of keys) {
      expect(key).toMatch(/^acs-[A-Za-z0-9_-]{43}$/);
      expect(looksLikeApiKey(key)).toBe(true);
      expect(hashApiKey(key)).toHaveLength(32);
    }
    // FIPS 180-2 test vector: SHA-256("abc").
    expect(hashApiKey("abc").toString("hex")).toBe(
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    );
    expect(apiKeyHint("acs-abcdefWXYZ")).toBe("acs-…WXYZ");
    expect(looksLikeApiKey("sk-abc")).toBe(false);
  });
});

describe("Hold ids", () => {
  it("are hold_ + 24 lowercase hex and distinct, across refills of the random pool", () => {
    const ids = new Set<string>();
    for (let i = 0; i < 2000; i++) {
      const id = generateHoldId();
      expect(id).toMatch(/^hold_[0-9a-f]{24}$/);
      ids.add(id);
    }
    expect(ids.size).toBe(2000);
  });
});

describe("utcDay", () => {
  it("is the UTC date of an epoch ms, whatever the order of the calls (the last day is reused)", () => {
    const iso = (ms: number) => new Date(ms).toISOString().slice(0, 10);
    const day = 86_400_000;
    const times = [
      0,
      day - 1,
      day,
      -1,
      -day,
      -day - 1,
      1_767_225_599_999,
      1_767_225_600_000,
      1_767_225_599_999,
    ];
    for (const t of [...times, ...times.reverse()]) expect(utcDay(t)).toBe(iso(t));
  });
});
