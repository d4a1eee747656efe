// acs.v1.Tensor ↔ numbers: element widths, bounded byte-length checks, zstd, bf16/f16/f32.
import { endianness } from "node:os";
import { create } from "@bufbuild/protobuf";
import { Compression, Dtype, type Tensor, TensorSchema } from "../../gen/acs/v1/lens_pb.js";
import { zstdCompress, zstdDecompressExact } from "./bounded-zstd.js";
import { bf16BitsFromFloat32Bits, f16BitsFromFloat32Bits, numberFromF16 } from "./float-bits.js";
import { TensorRefusal } from "./tensor-refusal.js";

if (endianness() !== "LE") {
  // Tensor bytes are little-endian and are read through typed-array views.
  throw new Error("the lens tensor codec needs a little-endian host");
}

/** Most numbers one Tensor may hold: 2^25 (128 MiB as float32), checked before any allocation. */
export const MAX_TENSOR_ELEMENTS = 2 ** 25;

/** The tensor element types the codec reads and writes. */
export type TensorDtype = Dtype.BFLOAT16 | Dtype.FLOAT16 | Dtype.FLOAT32;

/** Bytes per element of `dtype`: 2 for bf16/f16, 4 for f32. */
export function dtypeWidth(dtype: TensorDtype): 2 | 4 {
  return dtype === Dtype.FLOAT32 ? 4 : 2;
}

/** The usual name of `dtype`: `bfloat16`, `float16`, `float32`. */
export function dtypeName(dtype: TensorDtype): string {
  return dtype === Dtype.BFLOAT16 ? "bfloat16" : dtype === Dtype.FLOAT16 ? "float16" : "float32";
}

/** True when `dtype` is one of the three element types (not UNSPECIFIED, not an unknown number). */
export function isTensorDtype(dtype: number): dtype is TensorDtype {
  return dtype === Dtype.BFLOAT16 || dtype === Dtype.FLOAT16 || dtype === Dtype.FLOAT32;
}

/** `[2, 4096]` — a shape as messages print it. */
export function formatShape(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

/**
 * The number of elements of `shape` (product of its dims), refusing a dim that is not a uint32
 * and a product above `maxElements` (checked as it multiplies, so it never overflows).
 */
export function tensorElementCount(shape: readonly number[], maxElements = MAX_TENSOR_ELEMENTS): number {
  let count = 1;
  for (const dim of shape) {
    if (!Number.isInteger(dim) || dim < 0 || dim > 0xffffffff) {
      throw new TensorRefusal(`shape ${formatShape(shape)} has a dimension that is not an integer ≥ 0`);
    }
    count *= dim;
    if (count > maxElements) {
      throw new TensorRefusal(
        `shape ${formatShape(shape)} holds more than ${maxElements} numbers, the most one tensor may hold`,
      );
    }
  }
  return count;
}

/** "shape [2, 4096] holds 8192 numbers (32768 bytes as float32)" — the start of a length refusal. */
export function describeExpectedBytes(
  shape: readonly number[],
  dtype: TensorDtype,
  elements: number,
): string {
  return `shape ${formatShape(shape)} holds ${elements} numbers (${elements * dtypeWidth(dtype)} bytes as ${dtypeName(dtype)})`;
}

/** Checks dtype, compression and shape of `tensor`; returns its element count. */
function checkHeader(tensor: Tensor, maxElements: number): { dtype: TensorDtype; elements: number } {
  const dtype = tensor.dtype;
  if (!isTensorDtype(dtype)) {
    throw new TensorRefusal(`dtype ${dtype} is not one of BFLOAT16, FLOAT16, FLOAT32`, { field: "dtype" });
  }
  if (tensor.compression !== Compression.UNSPECIFIED && tensor.compression !== Compression.ZSTD) {
    throw new TensorRefusal(`compression ${tensor.compression} is not one of UNSPECIFIED, ZSTD`, {
      field: "compression",
    });
  }
  return { dtype, elements: tensorElementCount(tensor.shape, maxElements) };
}

/**
 * The raw little-endian element bytes of `tensor` (inflated when it is zstd-compressed), after
 * checking them against its shape: elements × width must equal the raw byte length. A zstd frame
 * is inflated with bounded memory (never beyond the expected length). Throws TensorRefusal.
 */
export function tensorRawBytes(tensor: Tensor, maxElements = MAX_TENSOR_ELEMENTS): Uint8Array {
  const { dtype, elements } = checkHeader(tensor, maxElements);
  const expected = elements * dtypeWidth(dtype);
  if (tensor.compression === Compression.ZSTD) {
    try {
      return zstdDecompressExact(tensor.data, expected);
    } catch (err) {
      if (err instanceof TensorRefusal) {
        throw new TensorRefusal(`${describeExpectedBytes(tensor.shape, dtype, elements)} but ${err.message}`);
      }
      throw err;
    }
  }
  if (tensor.data.byteLength !== expected) {
    throw new TensorRefusal(
      `${describeExpectedBytes(tensor.shape, dtype, elements)} but data has ${tensor.data.byteLength} bytes`,
    );
  }
  return tensor.data;
}

/** A typed view of `bytes` (copied first when its offset is not a multiple of the width). */
function view16(bytes: Uint8Array): Uint16Array {
  const aligned = bytes.byteOffset % 2 === 0 ? bytes : bytes.slice();
  return new Uint16Array(aligned.buffer, aligned.byteOffset, aligned.byteLength >>> 1);
}

function view32(bytes: Uint8Array): Uint32Array {
  const aligned = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  return new Uint32Array(aligned.buffer, aligned.byteOffset, aligned.byteLength >>> 2);
}

let f16Table: Float32Array | undefined;

/** float32 value of every half-precision bit pattern (256 KiB, built on first use). */
function halfTable(): Float32Array {
  if (f16Table === undefined) {
    f16Table = new Float32Array(65536);
    for (let bits = 0; bits < 65536; bits++) f16Table[bits] = numberFromF16(bits);
  }
  return f16Table;
}

/**
 * Raw element bytes of `dtype` → float32 values (exact: every bf16 and f16 value is a float32).
 * `bytes.byteLength` must be a multiple of the width.
 */
export function rawBytesToFloat32(bytes: Uint8Array, dtype: TensorDtype): Float32Array {
  if (dtype === Dtype.FLOAT32) {
    const out = new Float32Array(bytes.byteLength >>> 2);
    new Uint8Array(out.buffer).set(bytes);
    return out;
  }
  const src = view16(bytes);
  const out = new Float32Array(src.length);
  if (dtype === Dtype.BFLOAT16) {
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < src.length; i++) bits[i] = src[i]! << 16;
  } else {
    const table = halfTable();
    for (let i = 0; i < src.length; i++) out[i] = table[src[i]!]!;
  }
  return out;
}

/**
 * float32 values → raw little-endian bytes of `dtype`, rounding to nearest even for bf16/f16
 * (f16 overflow → ±Infinity; NaN stays NaN).
 */
export function float32ToRawBytes(values: Float32Array, dtype: TensorDtype): Uint8Array {
  if (dtype === Dtype.FLOAT32) {
    return new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength));
  }
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const out = new Uint16Array(values.length);
  if (dtype === Dtype.BFLOAT16) {
    for (let i = 0; i < bits.length; i++) out[i] = bf16BitsFromFloat32Bits(bits[i]!);
  } else {
    for (let i = 0; i < bits.length; i++) out[i] = f16BitsFromFloat32Bits(bits[i]!);
  }
  return new Uint8Array(out.buffer);
}

/** Index of the first NaN or ±Infinity among raw element bytes of `dtype`, or −1 when all are finite. */
export function firstNonFinite(bytes: Uint8Array, dtype: TensorDtype): number {
  if (dtype === Dtype.FLOAT32) {
    const bits = view32(bytes);
    for (let i = 0; i < bits.length; i++) if ((bits[i]! & 0x7f800000) === 0x7f800000) return i;
    return -1;
  }
  const mask = dtype === Dtype.BFLOAT16 ? 0x7f80 : 0x7c00;
  const bits = view16(bytes);
  for (let i = 0; i < bits.length; i++) if ((bits[i]! & mask) === mask) return i;
  return -1;
}

/** The multi-index of flat (C-order) element `index` in `shape`, e.g. `[0, 3, 17]`. */
export function unflattenIndex(index: number, shape: readonly number[]): number[] {
  const out = new Array<number>(shape.length).fill(0);
  let rest = index;
  for (let d = shape.length - 1; d >= 0; d--) {
    const dim = shape[d]!;
    out[d] = dim === 0 ? 0 : rest % dim;
    rest = dim === 0 ? 0 : Math.floor(rest / dim);
  }
  return out;
}

/**
 * The values of `tensor` as float32 (C order), after every check of {@link tensorRawBytes}.
 * Throws TensorRefusal.
 */
export function decodeTensor(tensor: Tensor, maxElements = MAX_TENSOR_ELEMENTS): Float32Array {
  const dtype = tensor.dtype as TensorDtype; // checked by tensorRawBytes
  return rawBytesToFloat32(tensorRawBytes(tensor, maxElements), dtype);
}

/** Options of {@link encodeTensor}. */
export interface EncodeTensorOptions {
  /** Element type of the bytes. Default FLOAT32. */
  dtype?: TensorDtype;
  /** zstd (level 1) or raw. Default raw (UNSPECIFIED). */
  compression?: Compression;
}

/**
 * Numbers (C order) → acs.v1.Tensor of `shape`, in `dtype` (rounded to nearest even), raw or
 * zstd level 1. Throws TensorRefusal when `values.length` is not the product of `shape`.
 */
export function encodeTensor(
  values: Float32Array | readonly number[],
  shape: readonly number[],
  options: EncodeTensorOptions = {},
): Tensor {
  const dtype = options.dtype ?? Dtype.FLOAT32;
  const compression = options.compression ?? Compression.UNSPECIFIED;
  const elements = tensorElementCount(shape);
  if (values.length !== elements) {
    throw new TensorRefusal(
      `shape ${formatShape(shape)} holds ${elements} numbers but ${values.length} were given`,
    );
  }
  const f32 = values instanceof Float32Array ? values : Float32Array.from(values);
  const raw = float32ToRawBytes(f32, dtype);
  const data = compression === Compression.ZSTD ? new Uint8Array(zstdCompress(raw)) : raw;
  return create(TensorSchema, { dtype, shape: [...shape], data, compression });
}
