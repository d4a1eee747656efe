// Counting shutdown signals: copies of the first (the process group's and a parent's) are one.
import { describe, expect, it } from "vitest";
import { createSignalCounter, SIGNAL_COPY_MS } from "../../src/app/shutdown-signals.js";

describe("createSignalCounter", () => {
  it.each([
    ["the group's and npm's copy at once", [0, 3], ["first", "copy"]],
    [
      "a copy just inside the window, then a second Ctrl-C",
      [0, SIGNAL_COPY_MS - 1, 4000],
      ["first", "copy", "second"],
    ],
    [
      "a second signal at the window's end, and a third",
      [0, SIGNAL_COPY_MS, 9000],
      ["first", "second", "second"],
    ],
  ])("%s", (_name, times, kinds) => {
    const at = [...times];
    const count = createSignalCounter(SIGNAL_COPY_MS, () => at.shift() ?? Number.NaN);
    expect(times.map(() => count())).toEqual(kinds);
  });
});
