import { fromBinary, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CreateCompletionRequestSchema } from "../../../gen/acs/v1/completions_pb.js";
import { ApiError } from "../../../src/core/errors/index.js";
import {
  completionRequestFieldNames,
  decodeCompletionRequest,
} from "../../../src/surfaces/rest/decode-completion-request.js";

/** Decodes, and checks the outcome is a decoded request that encodes, or an ApiError 400. */
function decodeOrRefuse(body: string): "decoded" | "refused" {
  try {
    const { request, stream } = decodeCompletionRequest(body);
    expect(typeof stream).toBe("boolean");
    // Every decoded value is representable in the proto (int32 / int64 / double ranges).
    const bytes = toBinary(CreateCompletionRequestSchema, request);
    expect(fromBinary(CreateCompletionRequestSchema, bytes)).toEqual(request);
    return "decoded";
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    expect([err.status, err.code]).toEqual([400, "invalid_request"]);
    expect(err.message.length).toBeGreaterThan(0);
    return "refused";
  }
}

const fieldName = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom(...completionRequestFieldNames) },
  { weight: 1, arbitrary: fc.constantFrom("best_of", "__proto__", "constructor", "prototype", "toString") },
  { weight: 1, arbitrary: fc.string() },
);

const numberText = fc.oneof(
  fc.integer().map(String),
  fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }).map(String),
  fc.double({ noNaN: true, noDefaultInfinity: true }).map((x) => JSON.stringify(x)),
  fc
    .tuple(fc.integer({ min: -99, max: 99 }), fc.integer({ min: -400, max: 400 }))
    .map(([m, e]) => `${m}e${e}`),
  fc.constantFrom("1.0", "-0", "0.0e5", "1e999999999", "9223372036854775807", "-9223372036854775809"),
);

/** A JSON text for a value: arbitrary JSON, number texts as written, and near-valid shapes. */
const valueText: fc.Arbitrary<string> = fc.oneof(
  fc.jsonValue().map((v) => JSON.stringify(v)),
  numberText,
  fc.array(numberText, { maxLength: 4 }).map((xs) => `[${xs.join(",")}]`),
  fc
    .array(fc.array(numberText, { maxLength: 3 }), { maxLength: 3 })
    .map((rows) => `[${rows.map((row) => `[${row.join(",")}]`).join(",")}]`),
  fc
    .array(
      fc.dictionary(
        fc.constantFrom("activations", "layer_indices", "scale", "norm_match", "position_indices", "x"),
        fc.jsonValue(),
      ),
      {
        maxLength: 2,
      },
    )
    .map((v) => JSON.stringify(v)),
  fc
    .dictionary(fc.constantFrom("include_usage", "continuous_usage_stats", "__proto__"), fc.jsonValue())
    .map((v) => JSON.stringify(v)),
);

const requestLikeBody = fc
  .array(fc.tuple(fieldName, valueText), { maxLength: 8 })
  .map((entries) => `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`);

describe("decodeCompletionRequest never throws anything but an ApiError", () => {
  it("arbitrary strings", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 200 }), (body) => {
        decodeOrRefuse(body);
      }),
      { numRuns: 2000 },
    );
  });

  it("arbitrary JSON values", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        decodeOrRefuse(JSON.stringify(value));
      }),
      { numRuns: 2000 },
    );
  });

  it("objects with the request's field names and arbitrary values", () => {
    const outcomes = new Set<string>();
    fc.assert(
      fc.property(requestLikeBody, (body) => {
        outcomes.add(decodeOrRefuse(body));
      }),
      { numRuns: 3000 },
    );
    expect(outcomes).toEqual(new Set(["decoded", "refused"]));
  });

  it("a valid body cut or corrupted at any point", () => {
    const valid = JSON.stringify({
      model: "llama-8b",
      prompt: [[1, 2], [3]],
      max_tokens: 4,
      seed: 42,
      stop: ["\n"],
      stream: true,
      stream_options: { include_usage: true },
      apply_steering_vectors: [{ activations: [[0.5, 1]], layer_indices: [1], scale: 1.5 }],
    });
    expect(decodeOrRefuse(valid)).toBe("decoded");
    fc.assert(
      fc.property(fc.nat(valid.length), fc.string({ maxLength: 3 }), (at, insert) => {
        decodeOrRefuse(valid.slice(0, at));
        decodeOrRefuse(valid.slice(0, at) + insert + valid.slice(at + 1));
      }),
      { numRuns: 2000 },
    );
  });
});

describe("numbers are read exactly", () => {
  it("seed: every int64 round-trips exactly, everything beyond is refused with param seed", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(2n ** 66n), max: 2n ** 66n }), (seed) => {
        const body = `{"seed": ${seed}}`;
        if (seed >= -(2n ** 63n) && seed < 2n ** 63n) {
          expect(decodeCompletionRequest(body).request.seed).toBe(seed);
        } else {
          expect(() => decodeCompletionRequest(body)).toThrow(expect.objectContaining({ param: "seed" }));
        }
      }),
    );
  });

  it("int32 fields: integers in range decode, written as x, x.0 or with an exponent", () => {
    fc.assert(
      fc.property(fc.integer(), fc.constantFrom("", ".0", ".000", "e0"), (n, suffix) => {
        const text = n === 0 && suffix === "e0" ? "0e0" : `${n}${suffix}`;
        expect(decodeCompletionRequest(`{"max_tokens": ${text}}`).request.maxTokens).toBe(n);
      }),
    );
  });

  it("int32 fields: a string holding a number is refused (except priority, which takes it)", () => {
    fc.assert(
      fc.property(fc.integer(), (n) => {
        expect(() => decodeCompletionRequest(`{"n": "${n}"}`)).toThrow(
          expect.objectContaining({ param: "n", message: "Invalid type for 'n': expected a number." }),
        );
        expect(decodeCompletionRequest(`{"priority": "${n}"}`).request.priority).toBe(n);
      }),
    );
  });

  it("decimal fields: any finite double decodes to itself", () => {
    fc.assert(
      fc.property(fc.double({ noNaN: true, noDefaultInfinity: true }), (x) => {
        expect(decodeCompletionRequest(`{"temperature": ${JSON.stringify(x)}}`).request.temperature).toBe(
          x === 0 ? 0 : x,
        );
      }),
    );
  });
});
