import { create } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { Compression, Dtype, TensorSchema } from "../../gen/acs/v1/lens_pb.js";
import { bf16FromNumber, f16FromNumber, numberFromBf16, numberFromF16 } from "../../src/lens/float-bits.js";
import {
  decodeTensor,
  encodeTensor,
  firstNonFinite,
  float32ToRawBytes,
  MAX_TENSOR_ELEMENTS,
  rawBytesToFloat32,
  type TensorDtype,
  tensorElementCount,
  tensorRawBytes,
  unflattenIndex,
} from "../../src/lens/tensor-codec.js";
import { TensorRefusal } from "../../src/lens/tensor-refusal.js";

const dtypes: Array<[string, TensorDtype]> = [
  ["bfloat16", Dtype.BFLOAT16],
  ["float16", Dtype.FLOAT16],
  ["float32", Dtype.FLOAT32],
];
const compressions: Array<[string, Compression]> = [
  ["raw", Compression.UNSPECIFIED],
  ["zstd", Compression.ZSTD],
];

/** What `x` becomes once stored in `dtype`. */
function stored(x: number, dtype: TensorDtype): number {
  if (dtype === Dtype.BFLOAT16) return numberFromBf16(bf16FromNumber(x));
  if (dtype === Dtype.FLOAT16) return numberFromF16(f16FromNumber(x));
  return Math.fround(x);
}

function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(TensorRefusal);
    return (err as Error).message;
  }
  return expect.fail("expected a TensorRefusal");
}

const specials = [
  0,
  -0,
  1,
  -1,
  0.1,
  2 ** -24,
  2 ** -133,
  2 ** -149,
  65504,
  3.4e38,
  -3.4e38,
  Infinity,
  -Infinity,
  NaN,
];

describe("encodeTensor → decodeTensor", () => {
  for (const [dname, dtype] of dtypes) {
    for (const [cname, compression] of compressions) {
      it(`${dname} ${cname}: special values (±0, subnormals, max, ±Inf, NaN)`, () => {
        const tensor = encodeTensor(specials, [2, 7], { dtype, compression });
        expect(tensor.dtype).toBe(dtype);
        expect(tensor.compression).toBe(compression);
        expect(tensor.shape).toEqual([2, 7]);
        const out = decodeTensor(tensor);
        expect(Array.from(out, (v, i) => Object.is(v, stored(specials[i]!, dtype)))).toEqual(
          specials.map(() => true),
        );
      });

      it(`${dname} ${cname}: random arrays round-trip (fast-check)`, () => {
        fc.assert(
          fc.property(
            fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 1, maxLength: 3 }).chain((shape) =>
              fc.tuple(
                fc.constant(shape),
                fc.float32Array({
                  minLength: shape.reduce((a, b) => a * b, 1),
                  maxLength: shape.reduce((a, b) => a * b, 1),
                }),
              ),
            ),
            ([shape, values]) => {
              const out = decodeTensor(encodeTensor(values, shape, { dtype, compression }));
              expect(out.length).toBe(values.length);
              values.forEach((v, i) => {
                expect(Object.is(out[i], stored(v, dtype)), `element ${i}: ${v} → ${out[i]}`).toBe(true);
              });
            },
          ),
          { numRuns: 200 },
        );
      });
    }
  }

  it("bf16 bytes are the upper halves of the float32 bits, little-endian", () => {
    const tensor = encodeTensor([1, -2, 0.1], [3], { dtype: Dtype.BFLOAT16 });
    expect(Array.from(tensor.data)).toEqual([0x80, 0x3f, 0x00, 0xc0, 0xcd, 0x3d]);
  });

  it("f32 bytes are IEEE little-endian and keep NaN payloads", () => {
    const values = new Float32Array(2);
    new Uint32Array(values.buffer).set([0x7fc00001, 0x00000001]);
    const tensor = encodeTensor(values, [2]);
    expect(Array.from(tensor.data)).toEqual([0x01, 0x00, 0xc0, 0x7f, 0x01, 0x00, 0x00, 0x00]);
    expect(Array.from(new Uint32Array(decodeTensor(tensor).buffer))).toEqual([0x7fc00001, 0x00000001]);
  });

  it("reads bytes at an odd offset", () => {
    const raw = float32ToRawBytes(Float32Array.of(1.5, -2.25), Dtype.FLOAT32);
    const shifted = new Uint8Array(raw.length + 1);
    shifted.set(raw, 1);
    expect(Array.from(rawBytesToFloat32(shifted.subarray(1), Dtype.FLOAT32))).toEqual([1.5, -2.25]);
    const half = float32ToRawBytes(Float32Array.of(1.5, -2.25), Dtype.FLOAT16);
    const shiftedHalf = new Uint8Array(half.length + 1);
    shiftedHalf.set(half, 1);
    expect(Array.from(rawBytesToFloat32(shiftedHalf.subarray(1), Dtype.FLOAT16))).toEqual([1.5, -2.25]);
    expect(firstNonFinite(shiftedHalf.subarray(1), Dtype.FLOAT16)).toBe(-1);
  });

  it("refuses values that do not fill the shape", () => {
    expect(refusal(() => encodeTensor([1, 2, 3], [2, 2]))).toBe(
      "shape [2, 2] holds 4 numbers but 3 were given",
    );
  });
});

describe("tensorRawBytes refuses bytes that do not match the shape", () => {
  const f32 = (shape: number[], data: Uint8Array, compression = Compression.UNSPECIFIED) =>
    create(TensorSchema, { dtype: Dtype.FLOAT32, shape, data, compression });
  const cases: Array<[string, () => ReturnType<typeof f32>, string | RegExp]> = [
    [
      "raw too short",
      () => f32([2, 4096], new Uint8Array(100)),
      "shape [2, 4096] holds 8192 numbers (32768 bytes as float32) but data has 100 bytes",
    ],
    [
      "raw too long",
      () => f32([1], new Uint8Array(8)),
      "shape [1] holds 1 numbers (4 bytes as float32) but data has 8 bytes",
    ],
    [
      "bf16 width",
      () => create(TensorSchema, { dtype: Dtype.BFLOAT16, shape: [3], data: new Uint8Array(12) }),
      "shape [3] holds 3 numbers (6 bytes as bfloat16) but data has 12 bytes",
    ],
    [
      "zstd of the wrong size",
      () =>
        f32([8], encodeTensor([1, 2, 3, 4], [4], { compression: Compression.ZSTD }).data, Compression.ZSTD),
      "shape [8] holds 8 numbers (32 bytes as float32) but the zstd frame declares 16 bytes",
    ],
    [
      "not zstd",
      () => f32([1], Uint8Array.of(1, 2, 3, 4), Compression.ZSTD),
      /shape \[1\] holds 1 numbers \(4 bytes as float32\) but data is not a zstd frame/,
    ],
    [
      "unknown dtype",
      () => create(TensorSchema, { dtype: 7 as Dtype, shape: [1], data: new Uint8Array(4) }),
      /dtype 7/,
    ],
    ["dtype unspecified", () => create(TensorSchema, { dtype: Dtype.UNSPECIFIED, shape: [1] }), /dtype 0/],
    ["unknown compression", () => f32([1], new Uint8Array(4), 9 as Compression), /compression 9/],
    [
      "over 2^25 numbers",
      () => f32([2 ** 13, 2 ** 13, 2], new Uint8Array(0)),
      /holds more than 33554432 numbers/,
    ],
  ];
  it.each(cases)("%s", (_name, tensor, message) => {
    const t = tensor();
    expect(refusal(() => tensorRawBytes(t))).toMatch(message);
  });
});

describe("helpers", () => {
  it.each([
    [[2, 4096], 8192],
    [[32, 256, 4096], 2 ** 25],
    [[1], 1],
    [[0, 5], 0],
  ])("tensorElementCount(%j) = %i", (shape, count) => {
    expect(tensorElementCount(shape)).toBe(count);
  });

  it("tensorElementCount refuses before overflowing", () => {
    expect(refusal(() => tensorElementCount([0xffffffff, 0xffffffff, 0xffffffff]))).toMatch(
      /more than 33554432/,
    );
    expect(refusal(() => tensorElementCount([MAX_TENSOR_ELEMENTS + 1]))).toMatch(/more than/);
    expect(refusal(() => tensorElementCount([1.5]))).toMatch(/not an integer/);
  });

  it.each([
    [0, [2, 3, 4], [0, 0, 0]],
    [5, [2, 3, 4], [0, 1, 1]],
    [23, [2, 3, 4], [1, 2, 3]],
    [7, [8], [7]],
  ])("unflattenIndex(%i, %j) = %j", (index, shape, expected) => {
    expect(unflattenIndex(index, shape)).toEqual(expected);
  });

  for (const [dname, dtype] of dtypes) {
    it.each([
      [[1, 2, 3], -1],
      [[1, NaN, 3], 1],
      [[1, 2, Infinity], 2],
      [[-Infinity, 2, 3], 0],
      [[65504, 2 ** -24, -0], -1],
    ])(`firstNonFinite ${dname} %j = %i`, (values, expected) => {
      expect(firstNonFinite(float32ToRawBytes(Float32Array.from(values), dtype), dtype)).toBe(expected);
    });
  }

  it("firstNonFinite sees f16 overflow as Infinity (1e5 does not fit in half precision)", () => {
    expect(firstNonFinite(float32ToRawBytes(Float32Array.of(1, 1e5), Dtype.FLOAT16), Dtype.FLOAT16)).toBe(1);
  });
});
