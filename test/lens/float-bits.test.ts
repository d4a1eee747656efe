import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  bf16BitsFromFloat32Bits,
  bf16FromNumber,
  f16FromNumber,
  float32Bits,
  float32FromBits,
  numberFromBf16,
  numberFromF16,
} from "../../src/lens/float-bits.js";

const hex = (n: number): string => `0x${n.toString(16).padStart(4, "0")}`;

describe("bfloat16 encoding (round to nearest, ties to even)", () => {
  // [input float32 bits, expected bf16 bits, why]
  const cases: Array<[number, number, string]> = [
    [0x3f800000, 0x3f80, "1"],
    [0xc0000000, 0xc000, "-2"],
    [0x00000000, 0x0000, "+0"],
    [0x80000000, 0x8000, "-0 keeps its sign"],
    [0x7f800000, 0x7f80, "+Infinity"],
    [0xff800000, 0xff80, "-Infinity"],
    [0x7fc00000, 0x7fc0, "quiet NaN"],
    [0x7f800001, 0x7fc0, "signalling NaN with a low payload stays NaN (not Infinity)"],
    [0xffa00000, 0xffe0, "negative NaN keeps sign and payload, quiet bit set"],
    [0x3f808000, 0x3f80, "exact tie, even below → down"],
    [0x3f818000, 0x3f82, "exact tie, odd below → up"],
    [0x3f808001, 0x3f81, "just above the tie → up"],
    [0x3f807fff, 0x3f80, "just below the tie → down"],
    [0x3dcccccd, 0x3dcd, "0.1"],
    [0x7f7fffff, 0x7f80, "float32 max rounds to Infinity"],
    [0x7f7f7fff, 0x7f7f, "largest value that stays finite"],
    [0x00000001, 0x0000, "smallest float32 subnormal → +0"],
    [0x00010000, 0x0001, "smallest bf16 subnormal is exact"],
    [0x0000ffff, 0x0001, "subnormal rounding up"],
    [0x807fffff, 0x8080, "negative subnormal rounds up into the normal range"],
  ];
  it.each(cases)("float32 bits %s → bf16 %s (%s)", (input, expected) => {
    expect(hex(bf16BitsFromFloat32Bits(input))).toBe(hex(expected));
  });
});

describe("half precision encoding (round to nearest, ties to even)", () => {
  // [input number (exact in float32), expected f16 bits, why]
  const cases: Array<[number, number, string]> = [
    [1, 0x3c00, "1"],
    [-2, 0xc000, "-2"],
    [0, 0x0000, "+0"],
    [-0, 0x8000, "-0"],
    [0.1, 0x2e66, "0.1"],
    [65504, 0x7bff, "max finite"],
    [65519, 0x7bff, "below the overflow tie"],
    [65520, 0x7c00, "overflow tie rounds to Infinity (odd mantissa)"],
    [1e9, 0x7c00, "overflow → Infinity"],
    [-1e9, 0xfc00, "overflow → -Infinity"],
    [Number.POSITIVE_INFINITY, 0x7c00, "+Infinity"],
    [Number.NEGATIVE_INFINITY, 0xfc00, "-Infinity"],
    [1 + 2 ** -11, 0x3c00, "tie, even below → down"],
    [1 + 3 * 2 ** -11, 0x3c02, "tie, odd below → up"],
    [2 ** -14, 0x0400, "smallest normal"],
    [2 ** -14 - 2 ** -25, 0x0400, "tie between largest subnormal (odd) and smallest normal → up"],
    [2 ** -24, 0x0001, "smallest subnormal"],
    [2 ** -25, 0x0000, "half the smallest subnormal, tie to even → 0"],
    [1.5 * 2 ** -25, 0x0001, "above half → smallest subnormal"],
    [3 * 2 ** -25, 0x0002, "subnormal tie 1.5 units → 2 (even)"],
    [5 * 2 ** -25, 0x0002, "subnormal tie 2.5 units → 2 (even)"],
    [-(2 ** -24), 0x8001, "negative smallest subnormal"],
    [2 ** -30, 0x0000, "far below → +0"],
    [-(2 ** -30), 0x8000, "far below → -0"],
  ];
  it.each(cases)("%s → f16 %s (%s)", (input, expected) => {
    expect(hex(f16FromNumber(input))).toBe(hex(expected));
  });

  it("NaN stays NaN", () => {
    expect(Number.isNaN(numberFromF16(f16FromNumber(Number.NaN)))).toBe(true);
    expect(f16FromNumber(Number.NaN) & 0x7c00).toBe(0x7c00);
  });
});

describe("decoding", () => {
  const f16: Array<[number, number]> = [
    [0x0001, 2 ** -24],
    [0x03ff, 1023 * 2 ** -24],
    [0x0400, 2 ** -14],
    [0x7bff, 65504],
    [0x3c00, 1],
    [0xc000, -2],
    [0x7c00, Number.POSITIVE_INFINITY],
    [0xfc00, Number.NEGATIVE_INFINITY],
    [0x8000, -0],
  ];
  it.each(f16)("f16 %s → %s", (bits, value) => {
    expect(Object.is(numberFromF16(bits), value)).toBe(true);
  });
  const bf16: Array<[number, number]> = [
    [0x3f80, 1],
    [0xc000, -2],
    [0x0001, 2 ** -133],
    [0x7f7f, float32FromBits(0x7f7f0000)],
    [0x7f80, Number.POSITIVE_INFINITY],
    [0x8000, -0],
  ];
  it.each(bf16)("bf16 %s → %s", (bits, value) => {
    expect(Object.is(numberFromBf16(bits), value)).toBe(true);
  });
});

/** The nearest of the sorted values of a 16-bit format (positive patterns 0…maxBits), ties to even. */
function referenceRound(x: number, decode: (bits: number) => number, infBits: number): number {
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  let lo = 0;
  let hi = infBits; // decode(infBits) = Infinity
  while (hi - lo > 1) {
    const mid = (lo + hi) >>> 1;
    if (decode(mid) <= a) lo = mid;
    else hi = mid;
  }
  // decode(lo) ≤ a < decode(hi); Infinity counts as the next step past the largest finite value
  const below = decode(lo);
  const above = hi === infBits ? 2 * decode(hi - 1) - decode(hi - 2) : decode(hi);
  if (a === below) return sign | lo;
  const dLo = a - below;
  const dHi = above - a;
  return sign | (dLo < dHi || (dLo === dHi && (lo & 1) === 0) ? lo : hi);
}

describe("properties (fast-check)", () => {
  const finiteFloat32 = fc.float({ noNaN: true, noDefaultInfinity: true });

  it("bf16 encoding picks the nearest bf16 value, ties to even", () => {
    fc.assert(
      fc.property(finiteFloat32, (x) => {
        expect(hex(bf16FromNumber(x))).toBe(hex(referenceRound(x, numberFromBf16, 0x7f80)));
      }),
      { numRuns: 20_000 },
    );
  });

  it("f16 encoding picks the nearest f16 value, ties to even", () => {
    const inF16Range = fc.oneof(
      finiteFloat32,
      fc.double({ min: -70000, max: 70000, noNaN: true }).map(Math.fround),
    );
    fc.assert(
      fc.property(inF16Range, (x) => {
        expect(hex(f16FromNumber(x))).toBe(hex(referenceRound(x, numberFromF16, 0x7c00)));
      }),
      { numRuns: 20_000 },
    );
  });

  it("every bf16 and f16 bit pattern survives decode → encode (NaN stays NaN)", () => {
    for (let bits = 0; bits < 0x10000; bits++) {
      const b = numberFromBf16(bits);
      const h = numberFromF16(bits);
      if (Number.isNaN(b)) expect(Number.isNaN(numberFromBf16(bf16FromNumber(b)))).toBe(true);
      else if (bf16FromNumber(b) !== bits)
        expect.fail(`bf16 ${hex(bits)} → ${b} → ${hex(bf16FromNumber(b))}`);
      if (Number.isNaN(h)) expect(Number.isNaN(numberFromF16(f16FromNumber(h)))).toBe(true);
      else if (f16FromNumber(h) !== bits) expect.fail(`f16 ${hex(bits)} → ${h} → ${hex(f16FromNumber(h))}`);
    }
  });

  it("float32Bits/float32FromBits are inverse on non-NaN patterns", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 0xffffffff }), (bits) => {
        fc.pre((bits & 0x7f800000) !== 0x7f800000 || (bits & 0x7fffff) === 0);
        expect(float32Bits(float32FromBits(bits))).toBe(bits);
      }),
    );
  });
});
