// The check order in code (checkOrder, src/service/completions/check-order.ts) is the order the
// contract lists (proto/API.md §3 "Order of checks"): the same names, in the same order.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { checkOrder } from "../../../src/service/completions/check-order.js";

/** The step names of API.md §3's numbered "Order of checks" list. */
function contractOrder(): string[] {
  const api = readFileSync(new URL("../../../proto/API.md", import.meta.url), "utf8");
  const section = api.slice(api.indexOf("## 3."), api.indexOf("## 4."));
  const list = section.slice(section.indexOf("Order of checks"));
  return [...list.matchAll(/^ {2}\d+\. `([a-z_]+)`/gm)].map((m) => m[1] as string);
}

describe("checkOrder", () => {
  it("lists the steps of proto/API.md §3, in its order", () => {
    const names = contractOrder();
    expect(names.length).toBeGreaterThan(10);
    expect(checkOrder.map((step) => step.name)).toEqual(names);
  });

  it("names each step once", () => {
    const names = checkOrder.map((step) => step.name);
    expect(new Set(names).size).toBe(names.length);
  });
});
