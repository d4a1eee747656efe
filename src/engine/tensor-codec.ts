/**
 * vllm-lens tensor dicts: `{data: base64, dtype, original_dtype, shape, compression}`.
 * Bytes are little-endian, C order. bf16 travels as dtype "int16" with original_dtype
 * "torch.bfloat16" (float32 value = bits << 16). compression "zstd" (level 1) on what the engine
 * sends; a dict without compression (or null) is raw bytes.
 */
import { compress, DecompressStream } from "zstd-napi";

/** A tensor dict as sent over JSON. */
export interface TensorDict {
  data: string;
  dtype: string;
  original_dtype: string;
  shape: number[];
  compression?: string | null;
}

/** A decoded tensor: float32 values in C order and its shape. */
export interface DecodedTensor {
  data: Float32Array;
  shape: number[];
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 → bf16 bits, round to nearest even (NaN stays NaN). */
export function toBf16Bits(value: number): number {
  f32[0] = value;
  const bits = u32[0]!;
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x7fffff) !== 0) return ((bits >>> 16) | 0x40) & 0xffff;
  const rounded = bits + 0x7fff + ((bits >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}

/** bf16 bits → float32 value. */
export function fromBf16Bits(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/** Rounds a float32 value to the nearest bf16 value. */
export function roundBf16(value: number): number {
  return fromBf16Bits(toBf16Bits(value));
}

/** Encodes bf16 bits (C order) as a vllm-lens tensor dict (zstd level 1, base64). */
export function encodeBf16Tensor(bits: Uint16Array, shape: number[]): TensorDict {
  const bytes = Buffer.alloc(bits.length * 2);
  for (let i = 0; i < bits.length; i++) bytes.writeUInt16LE(bits[i]!, i * 2);
  return {
    data: compress(bytes, { compressionLevel: 1 }).toString("base64"),
    dtype: "int16",
    original_dtype: "torch.bfloat16",
    shape,
    compression: "zstd",
  };
}

/** Encodes float32 values as a bf16 tensor dict. */
export function encodeFloatTensorAsBf16(values: Float32Array, shape: number[]): TensorDict {
  const bits = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) bits[i] = toBf16Bits(values[i]!);
  return encodeBf16Tensor(bits, shape);
}

/** zstd-decompresses with a hard cap on the output size (streaming, so a bomb never inflates). */
export async function zstdDecompressCapped(input: Uint8Array, maxBytes: number): Promise<Buffer> {
  return await new Promise<Buffer>((resolve, reject) => {
    const stream = new DecompressStream();
    const chunks: Buffer[] = [];
    let total = 0;
    let done = false;
    stream.on("data", (chunk: Buffer) => {
      if (done) return;
      total += chunk.length;
      if (total > maxBytes) {
        done = true;
        stream.destroy();
        reject(new Error(`decompressed tensor exceeds ${maxBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    stream.on("error", (err: Error) => {
      if (!done) {
        done = true;
        reject(err);
      }
    });
    stream.on("end", () => {
      if (!done) {
        done = true;
        resolve(Buffer.concat(chunks));
      }
    });
    stream.end(Buffer.from(input.buffer, input.byteOffset, input.byteLength));
  });
}

function halfToFloat(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const f = h & 0x3ff;
  if (e === 0) return s * 2 ** -14 * (f / 1024);
  if (e === 31) return f ? Number.NaN : s * Number.POSITIVE_INFINITY;
  return s * 2 ** (e - 15) * (1 + f / 1024);
}

/**
 * Decodes a tensor dict. dtype float32 | float16 | bfloat16 | int16 (+ original_dtype
 * torch.bfloat16 → bf16 bits; otherwise plain int16 values).
 * @throws Error with a readable message on bad base64 size, unknown dtype/compression, size mismatch.
 */
export async function decodeTensorDict(
  dict: Record<string, unknown>,
  maxValues: number,
): Promise<DecodedTensor> {
  const { data, dtype, shape, compression } = dict;
  const original = dict.original_dtype;
  if (typeof data !== "string") throw new Error("tensor data must be a base64 string");
  if (typeof dtype !== "string") throw new Error("tensor dtype must be a string");
  if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && (d as number) >= 0)) {
    throw new Error("tensor shape must be a list of non-negative integers");
  }
  const dims = shape as number[];
  const count = dims.reduce((a, b) => a * b, 1);
  if (count > maxValues) throw new Error(`tensor has ${count} values, more than ${maxValues}`);
  const dt = dtype.replace(/^torch\./, "");
  const width = dt === "float32" ? 4 : dt === "float16" || dt === "int16" || dt === "bfloat16" ? 2 : 0;
  if (width === 0) throw new Error(`unsupported tensor dtype ${dtype}`);
  let bytes: Buffer = Buffer.from(data, "base64");
  if (compression === "zstd") {
    bytes = await zstdDecompressCapped(bytes, count * width);
  } else if (compression !== undefined && compression !== null) {
    throw new Error(`unsupported tensor compression ${String(compression)}`);
  }
  if (bytes.length !== count * width) {
    throw new Error(
      `tensor data has ${bytes.length} bytes, shape ${JSON.stringify(dims)} needs ${count * width}`,
    );
  }
  const out = new Float32Array(count);
  const bf16 =
    dt === "bfloat16" || (dt === "int16" && typeof original === "string" && /bfloat16/.test(original));
  for (let i = 0; i < count; i++) {
    if (width === 4) out[i] = bytes.readFloatLE(i * 4);
    else if (bf16) out[i] = fromBf16Bits(bytes.readUInt16LE(i * 2));
    else if (dt === "float16") out[i] = halfToFloat(bytes.readUInt16LE(i * 2));
    else out[i] = bytes.readInt16LE(i * 2);
  }
  return { data: out, shape: dims };
}

/** Flattens nested number arrays (a JSON tensor) into values + shape. @throws Error when ragged or non-numeric. */
export function decodeNestedArray(value: unknown, maxValues: number): DecodedTensor {
  const shape: number[] = [];
  let probe: unknown = value;
  while (Array.isArray(probe)) {
    shape.push(probe.length);
    probe = probe[0];
  }
  const count = shape.reduce((a, b) => a * b, 1);
  if (count > maxValues) throw new Error(`tensor has ${count} values, more than ${maxValues}`);
  const out = new Float32Array(count);
  let k = 0;
  const walk = (node: unknown, depth: number): void => {
    if (depth === shape.length) {
      if (typeof node !== "number") throw new Error("tensor values must be numbers");
      out[k++] = node;
      return;
    }
    if (!Array.isArray(node) || node.length !== shape[depth]) throw new Error("tensor is ragged");
    for (const child of node) walk(child, depth + 1);
  };
  walk(value, 0);
  return { data: out, shape };
}
