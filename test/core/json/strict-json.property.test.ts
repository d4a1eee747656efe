import fc from "fast-check";
import { describe, it } from "vitest";
import { strictJsonProperty } from "../../helpers/strict-json-property.js";

// The decoder's property (test/helpers/strict-json-property.ts) at suite size; `npm run soak --
// json` runs the same property 100,000 times.
describe("strict JSON decoding agrees with exact references", () => {
  it("documents, corrupted bodies and number fields", async () => {
    await fc.assert(strictJsonProperty, { numRuns: 400 });
  });
});
