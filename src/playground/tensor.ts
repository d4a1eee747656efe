// Tensors of proto/API.md §6 decoded in the browser: the JSON object vllm-lens writes
// ({data: base64, dtype, original_dtype, shape, compression}) or plain nested arrays → float32.
// No DOM and no Node API beyond atob (both have it), so tests run it under Node too.
import { decompress } from "fzstd";

/** An encoded tensor as the API writes it (proto/API.md §6); bf16 travels as "int16" bits. */
export interface TensorObject {
  data: string;
  dtype: "float32" | "float16" | "int16";
  original_dtype?: string;
  shape: number[];
  compression?: "zstd" | null;
}

/** A decoded tensor: float32 values in C order and its shape. */
export interface DecodedTensor {
  values: Float32Array;
  shape: number[];
}

/** Thrown when a tensor cannot be read; the message says why. */
export class TensorDecodeError extends Error {
  override name = "TensorDecodeError";
}

function base64Bytes(text: string): Uint8Array {
  const binary = atob(text);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

/** float32 value of an IEEE half-precision bit pattern (uint16). */
export function halfToFloat(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** Little-endian element bytes → float32: bf16 by bit layout (its bits are a float32's upper half). */
export function bytesToFloat32(bytes: Uint8Array, dtype: TensorObject["dtype"]): Float32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === "float32") {
    const out = new Float32Array(bytes.byteLength >>> 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(i * 4, true);
    return out;
  }
  const out = new Float32Array(bytes.byteLength >>> 1);
  if (dtype === "int16") {
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < out.length; i++) bits[i] = view.getUint16(i * 2, true) << 16;
  } else {
    for (let i = 0; i < out.length; i++) out[i] = halfToFloat(view.getUint16(i * 2, true));
  }
  return out;
}

function isTensorObject(value: unknown): value is TensorObject {
  return typeof value === "object" && value !== null && !Array.isArray(value) && "data" in value;
}

function flatten(value: unknown, depth: number, shape: number[], out: number[]): void {
  if (typeof value === "number") {
    if (depth !== shape.length && shape.length > 0)
      throw new TensorDecodeError("nested arrays are not rectangular");
    out.push(value);
    return;
  }
  if (!Array.isArray(value)) throw new TensorDecodeError("a tensor holds numbers only");
  if (shape.length === depth) shape.push(value.length);
  else if (shape[depth] !== value.length) throw new TensorDecodeError("nested arrays are not rectangular");
  for (const item of value) flatten(item, depth + 1, shape, out);
}

/**
 * A tensor of the API (an encoded object or nested number arrays) → float32 values in C order.
 * Throws TensorDecodeError when the bytes do not match the shape or the dtype is unknown.
 */
export function decodeTensor(tensor: unknown): DecodedTensor {
  if (!isTensorObject(tensor)) {
    const shape: number[] = [];
    const out: number[] = [];
    flatten(tensor, 0, shape, out);
    return { values: Float32Array.from(out), shape };
  }
  const { dtype, shape } = tensor;
  if (dtype !== "float32" && dtype !== "float16" && dtype !== "int16") {
    throw new TensorDecodeError(`dtype "${String(dtype)}" is not one of float32, float16, int16`);
  }
  const elements = shape.reduce((a, b) => a * b, 1);
  const width = dtype === "float32" ? 4 : 2;
  let bytes = base64Bytes(tensor.data);
  if (tensor.compression === "zstd") bytes = decompress(bytes);
  if (bytes.byteLength !== elements * width) {
    throw new TensorDecodeError(
      `shape [${shape.join(", ")}] holds ${elements} numbers but the data has ${bytes.byteLength} bytes`,
    );
  }
  return { values: bytesToFloat32(bytes, dtype), shape: [...shape] };
}
