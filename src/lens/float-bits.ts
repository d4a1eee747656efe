// Bit-level conversions between IEEE float32 and the 16-bit float formats of a Tensor
// (bfloat16 and IEEE 754 half precision). Pure functions on numbers; the array versions live in
// tensor-codec.ts.

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The IEEE float32 bit pattern (uint32) of `value` after rounding it to float32. */
export function float32Bits(value: number): number {
  f32[0] = value;
  return u32[0]!;
}

/** The float32 whose bit pattern is the uint32 `bits`. */
export function float32FromBits(bits: number): number {
  u32[0] = bits;
  return f32[0]!;
}

/**
 * float32 bits (uint32) → bfloat16 bits (uint16), rounding to nearest, ties to even. NaN stays
 * NaN (quiet bit set, sign kept); values beyond the bf16 range round to ±Infinity.
 */
export function bf16BitsFromFloat32Bits(bits: number): number {
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) {
    return ((bits >>> 16) | 0x0040) & 0xffff;
  }
  const lsb = (bits >>> 16) & 1;
  return ((bits >>> 0) + 0x7fff + lsb) >>> 16;
}

/** bfloat16 bits (uint16) → float32 bits (uint32): the bf16 bits are the upper half. */
export function float32BitsFromBf16Bits(bits: number): number {
  return (bits << 16) >>> 0;
}

/** A number → bfloat16 bits (uint16), through float32, rounding to nearest even. */
export function bf16FromNumber(value: number): number {
  return bf16BitsFromFloat32Bits(float32Bits(value));
}

/** bfloat16 bits (uint16) → its exact value as a number. */
export function numberFromBf16(bits: number): number {
  return float32FromBits(float32BitsFromBf16Bits(bits));
}

/**
 * float32 bits (uint32) → IEEE half-precision bits (uint16), rounding to nearest, ties to even,
 * including the subnormal range; overflow gives ±Infinity, NaN stays a (quiet) NaN.
 */
export function f16BitsFromFloat32Bits(bits: number): number {
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  const mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant === 0 ? 0 : 0x0200 | (mant >>> 13));
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e >= 1) {
    let half = (e << 10) | (mant >>> 13);
    const rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (half & 1) === 1)) half += 1; // a carry into the exponent is right, up to Infinity
    return sign | half;
  }
  // Subnormal or zero in half precision: value = full × 2^(exp − 150), unit = 2^−24.
  const shift = 126 - exp; // ≥ 14
  if (shift > 24) return sign; // below half the smallest subnormal (or float32 zero/subnormal)
  const full = mant | 0x800000;
  let half = full >>> shift;
  const rest = full & ((1 << shift) - 1);
  const halfway = 1 << (shift - 1);
  if (rest > halfway || (rest === halfway && (half & 1) === 1)) half += 1;
  return sign | half;
}

/** IEEE half-precision bits (uint16) → its exact value as a number. */
export function numberFromF16(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** A number → IEEE half-precision bits (uint16), through float32, rounding to nearest even. */
export function f16FromNumber(value: number): number {
  return f16BitsFromFloat32Bits(float32Bits(value));
}
