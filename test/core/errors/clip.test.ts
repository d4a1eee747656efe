import { describe, expect, it } from "vitest";
import { clip, MAX_ECHO_CHARS, MAX_UPSTREAM_MESSAGE_CHARS } from "../../../src/core/errors/index.js";

describe("clip", () => {
  it.each([
    ["empty", "", 200, ""],
    ["shorter than the bound", "abc", 200, "abc"],
    ["exactly the bound", "a".repeat(200), 200, "a".repeat(200)],
    ["one over the bound", "a".repeat(201), 200, `${"a".repeat(200)}…`],
    ["a custom bound", "abcdef", 3, "abc…"],
    // "😀" is two UTF-16 units: a cut between them would leave a lone surrogate
    ["never splits a surrogate pair", `ab😀cd`, 3, "ab…"],
    ["keeps a whole pair that fits", `ab😀cd`, 4, "ab😀…"],
  ])("%s", (_name, text, max, expected) => {
    expect(clip(text, max)).toBe(expected);
  });

  it("bounds caller text at 200 and Inference's messages at 1,024 units (+ the ellipsis)", () => {
    expect(MAX_ECHO_CHARS).toBe(200);
    expect(MAX_UPSTREAM_MESSAGE_CHARS).toBe(1024);
    expect(clip("x".repeat(200_000))).toHaveLength(201);
    expect(clip("x".repeat(200_000), MAX_UPSTREAM_MESSAGE_CHARS)).toHaveLength(1025);
  });
});
