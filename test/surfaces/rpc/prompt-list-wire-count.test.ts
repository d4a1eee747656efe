// countWirePrompts reads the same number of prompts from a CreateCompletionRequest's wire bytes as
// protobuf-es decodes from them (src/service/checks.ts requestShape), for any mix of the prompt
// oneof's members written one after another (protobuf merges a repeated member, the last member
// set wins), and gives up (undefined) on bytes that are not well-formed protobuf.
import { create, fromBinary, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import { requestShape } from "../../../src/service/checks.js";
import { countWirePrompts } from "../../../src/surfaces/rpc/prompt-list-wire-count.js";

type Prompt = NonNullable<MessageInitShape<typeof CreateCompletionRequestSchema>["prompt"]>;

const prompt: fc.Arbitrary<Prompt> = fc.oneof(
  fc.string({ minLength: 1, maxLength: 4 }).map((value) => ({ case: "text" as const, value })),
  fc
    .array(fc.string({ maxLength: 3 }), { maxLength: 6 })
    .map((values) => ({ case: "texts" as const, value: { values } })),
  fc
    .array(fc.nat(1000), { maxLength: 4 })
    .map((values) => ({ case: "tokenIds" as const, value: { values } })),
  fc.array(fc.array(fc.nat(1000), { maxLength: 3 }), { maxLength: 5 }).map((lists) => ({
    case: "tokenIdsList" as const,
    value: { values: lists.map((values) => ({ values })) },
  })),
);

/** One message per prompt, with other fields between, written one after another. */
const messages = fc.array(
  fc.record({
    prompt,
    user: fc.option(fc.string({ maxLength: 5 }), { nil: undefined }),
    n: fc.option(fc.integer({ min: -3, max: 300 }), { nil: undefined }),
  }),
  { minLength: 1, maxLength: 4 },
);

function encode(
  parts: readonly { prompt: Prompt; user?: string | undefined; n?: number | undefined }[],
): Uint8Array {
  return Buffer.concat(
    parts.map((p) =>
      toBinary(
        CreateCompletionRequestSchema,
        create(CreateCompletionRequestSchema, {
          model: "m",
          prompt: p.prompt,
          ...(p.user === undefined ? {} : { user: p.user }),
          ...(p.n === undefined ? {} : { n: p.n }),
        }),
      ),
    ),
  );
}

describe("countWirePrompts", () => {
  it("counts what protobuf-es decodes, over merged and replaced oneof members", () => {
    fc.assert(
      fc.property(messages, (parts) => {
        const bytes = encode(parts);
        expect(countWirePrompts(bytes)).toBe(
          requestShape(fromBinary(CreateCompletionRequestSchema, bytes)).prompts,
        );
      }),
    );
  });

  it("gives up on bytes protobuf-es cannot read: a cut field, a group, a field number 0", () => {
    const whole = encode([{ prompt: { case: "texts", value: { values: ["a", "b"] } } }]);
    for (const bytes of [
      whole.subarray(0, whole.length - 1),
      Uint8Array.of(0x1b),
      Uint8Array.of(0x02, 0x00),
    ]) {
      expect(() => fromBinary(CreateCompletionRequestSchema, bytes)).toThrow();
      expect(countWirePrompts(bytes)).toBeUndefined();
    }
  });

  it("no prompt is 0", () => {
    expect(countWirePrompts(new Uint8Array(0))).toBe(0);
  });
});

describe("countWirePrompts with a limit", () => {
  it("says more than the limit exactly when there are more, over merged members", () => {
    fc.assert(
      fc.property(messages, fc.nat(8), (parts, limit) => {
        const bytes = encode(parts);
        const prompts = requestShape(fromBinary(CreateCompletionRequestSchema, bytes)).prompts;
        const counted = countWirePrompts(bytes, limit);
        expect(counted).toBeDefined();
        expect((counted as number) > limit).toBe(prompts > limit);
        if (prompts <= limit) expect(counted).toBe(prompts);
      }),
    );
  });
});
