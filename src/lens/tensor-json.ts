// Tensors in JSON: the REST forms of proto/API.md §6 (nested number arrays, or the vllm-lens dict) and
// the vllm-lens dict of Inference's responses.
import { create } from "@bufbuild/protobuf";
import { Compression, Dtype, type Tensor, TensorSchema } from "../../gen/acs/v1/lens_pb.js";
import { ApiError, invalidRequest } from "../core/errors/index.js";
import { zstdCompress, zstdDeclaredSize, zstdDecompressExact } from "./bounded-zstd.js";
import { decodeBase64, encodeBase64, strictBase64ByteLength } from "./strict-base64.js";
import {
  describeExpectedBytes,
  dtypeWidth,
  MAX_TENSOR_ELEMENTS,
  type TensorDtype,
  tensorElementCount,
} from "./tensor-codec.js";
import { TensorRefusal } from "./tensor-refusal.js";

/** A tensor as vllm-lens writes it in JSON. */
export interface VllmLensTensorJson {
  /** Standard base64 of the little-endian C-order bytes (zstd frame when `compression` is "zstd"). */
  data: string;
  /** numpy storage dtype; bf16 travels as "int16" bits. */
  dtype: "float32" | "float16" | "int16";
  /** torch dtype of the tensor ("torch.bfloat16", "torch.float16", "torch.float32"). */
  original_dtype?: string;
  /** Dimensions, outermost first. */
  shape: number[];
  /** "zstd" (one frame, level 1), or null/absent for raw bytes. */
  compression?: "zstd" | null;
}

/**
 * Most numbers one REST tensor may hold: 2^23, the cap on all steering numbers of a request
 * (MAX_STEERING_NUMBERS), so that a small zstd body or a ragged array cannot cost more than
 * 32 MiB of float32 before the request-wide checks run.
 */
export const MAX_REQUEST_TENSOR_ELEMENTS = 2 ** 23;

/** The keys of a vllm-lens tensor object (`{data, dtype, original_dtype?, shape, compression?}`). */
export const TENSOR_KEYS: ReadonlySet<string> = new Set([
  "data",
  "dtype",
  "original_dtype",
  "shape",
  "compression",
]);

/** dtype × original_dtype pairs a vllm-lens decoder reads as the same element type. */
const DTYPE_PAIRS: Record<string, { dtype: TensorDtype; original: string }> = {
  int16: { dtype: Dtype.BFLOAT16, original: "torch.bfloat16" },
  float16: { dtype: Dtype.FLOAT16, original: "torch.float16" },
  float32: { dtype: Dtype.FLOAT32, original: "torch.float32" },
};

const JSON_DTYPE: Record<TensorDtype, { dtype: VllmLensTensorJson["dtype"]; original: string }> = {
  [Dtype.BFLOAT16]: { dtype: "int16", original: "torch.bfloat16" },
  [Dtype.FLOAT16]: { dtype: "float16", original: "torch.float16" },
  [Dtype.FLOAT32]: { dtype: "float32", original: "torch.float32" },
};

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A JSON number (a plain JS number, as JSON.parse gives it); undefined for anything else. */
function jsonNumber(value: unknown): number | undefined {
  return typeof value === "number" ? value : undefined;
}

function jsonTypeName(value: unknown): string {
  if (value === undefined) return "nothing";
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "object") return "an object";
  if (typeof value === "string") return "a string";
  if (typeof value === "boolean") return "a boolean";
  return `a ${typeof value}`;
}

function indexPath(index: readonly number[]): string {
  return index.map((i) => `[${i}]`).join("");
}

/** Nested arrays (2D or 3D, rectangular, finite numbers) → a FLOAT32 tensor. */
function parseNestedArrays(value: unknown[]): Tensor {
  const shape: number[] = [];
  let probe: unknown = value;
  while (Array.isArray(probe)) {
    if (probe.length === 0) {
      const where = shape.length === 0 ? "" : ` at ${indexPath(shape.map(() => 0))}`;
      throw new TensorRefusal(`the array${where} is empty`);
    }
    shape.push(probe.length);
    probe = probe[0];
  }
  if (shape.length !== 2 && shape.length !== 3) {
    throw new TensorRefusal(
      `nested arrays of numbers must have 2 dimensions (layers, hidden) or 3 (layers, positions, hidden), not ${shape.length}`,
    );
  }
  const elements = tensorElementCount(shape, MAX_REQUEST_TENSOR_ELEMENTS);
  // Two passes: check everything first (types, finiteness, rectangular), then allocate and fill,
  // so that a small ragged body cannot make the shape of its first rows cost a big allocation.
  let out: Float32Array | undefined;
  let next = 0;
  const index: number[] = [];
  const walk = (node: unknown, depth: number): void => {
    const rows = node as unknown[];
    const last = depth === shape.length - 1;
    for (let i = 0; i < rows.length; i++) {
      index[depth] = i;
      const item = rows[i];
      if (last) {
        const number = jsonNumber(item);
        if (number === undefined) {
          throw new TensorRefusal("expected a number", { field: indexPath(index), isTypeError: true });
        }
        const single = Math.fround(number);
        if (!Number.isFinite(single)) {
          throw new TensorRefusal(
            `element ${indexPath(index)} (${number}) is not a finite float32 number; every number must be finite`,
          );
        }
        if (out !== undefined) out[next++] = single;
      } else {
        if (!Array.isArray(item)) {
          throw new TensorRefusal("expected an array", { field: indexPath(index), isTypeError: true });
        }
        if (item.length !== shape[depth + 1]) {
          throw new TensorRefusal(
            `the arrays are not rectangular: ${indexPath(index)} has ${item.length} ${item.length === 1 ? "entry" : "entries"} but ${indexPath(index.map(() => 0))} has ${shape[depth + 1]}`,
          );
        }
        walk(item, depth + 1);
      }
    }
    index.length = depth;
  };
  walk(value, 0);
  out = new Float32Array(elements);
  walk(value, 0);
  return create(TensorSchema, { dtype: Dtype.FLOAT32, shape, data: new Uint8Array(out.buffer) });
}

/** The vllm-lens dict's description (dtype, shape, compression) with every key's type checked. */
interface DictHeader {
  data: string;
  dtype: TensorDtype;
  shape: number[];
  zstd: boolean;
}

function readDictHeader(value: Record<string, unknown>, strictKeys: boolean): DictHeader {
  if (strictKeys) {
    for (const key of Object.keys(value)) {
      if (!TENSOR_KEYS.has(key)) {
        throw new TensorRefusal(
          `unknown field '${key}': a tensor object has only data, dtype, original_dtype, shape and compression`,
        );
      }
    }
  }
  const { data, dtype, original_dtype: original, shape, compression } = value;
  if (typeof data !== "string") {
    throw new TensorRefusal("expected a string", {
      field: "data",
      isTypeError: true,
    });
  }
  if (typeof dtype !== "string") {
    throw new TensorRefusal("expected a string", {
      field: "dtype",
      isTypeError: true,
    });
  }
  if (original !== undefined && original !== null && typeof original !== "string") {
    throw new TensorRefusal("expected a string", {
      field: "original_dtype",
      isTypeError: true,
    });
  }
  if (!Array.isArray(shape)) {
    throw new TensorRefusal("expected an array", {
      field: "shape",
      isTypeError: true,
    });
  }
  if (compression !== undefined && compression !== null && typeof compression !== "string") {
    throw new TensorRefusal("expected a string", {
      field: "compression",
      isTypeError: true,
    });
  }
  const pair = Object.hasOwn(DTYPE_PAIRS, dtype) ? DTYPE_PAIRS[dtype] : undefined;
  if (pair === undefined) {
    throw new TensorRefusal(`dtype "${dtype}" is not one of "float32", "float16", "int16" (bfloat16 bits)`);
  }
  if (original !== undefined && original !== null && original !== pair.original) {
    throw new TensorRefusal(
      `dtype "${dtype}" goes with original_dtype "${pair.original}" (or none), not "${original}"`,
    );
  }
  if (compression !== undefined && compression !== null && compression !== "zstd") {
    throw new TensorRefusal(`compression "${compression}" is not "zstd" or null`);
  }
  const dims: number[] = [];
  for (let i = 0; i < shape.length; i++) {
    const dim: unknown = shape[i];
    const number = jsonNumber(dim);
    if (number === undefined) {
      throw new TensorRefusal("expected an integer", { field: `shape[${i}]`, isTypeError: true });
    }
    if (!Number.isInteger(number) || number < 0 || number > 0xffffffff) {
      throw new TensorRefusal(`shape dimension ${number} is not an integer ≥ 0`);
    }
    dims.push(number);
  }
  // A request's shape is checked by protovalidate and checkLensShapes (the same words on every
  // surface); Inference's here.
  if (!strictKeys && (dims.length < 1 || dims.length > 3)) {
    throw new TensorRefusal(`shape [${dims.join(", ")}] has ${dims.length} dimensions; a tensor has 1 to 3`);
  }
  return { data, dtype: pair.dtype, shape: dims, zstd: compression === "zstd" };
}

/** The bytes of a dict's `data`, checked as strict base64 and (raw) against the shape. */
function dictBytes(header: DictHeader, elements: number): { bytes: Buffer; expected: number } {
  const expected = elements * dtypeWidth(header.dtype);
  const length = strictBase64ByteLength(header.data);
  if (length === null) {
    throw new TensorRefusal(
      "data is not strict base64 (only A–Z, a–z, 0–9, '+', '/', '=' padding at the end, length a multiple of 4)",
    );
  }
  if (!header.zstd && length !== expected) {
    throw new TensorRefusal(
      `${describeExpectedBytes(header.shape, header.dtype, elements)} but data decodes to ${length} bytes`,
    );
  }
  return { bytes: decodeBase64(header.data), expected };
}

/**
 * The vllm-lens dict of a request → Tensor, its bytes as sent (a zstd frame stays compressed).
 * Only types, dtype, compression and strict base64 are checked here; the shape, the byte length
 * and the values are checked by checkLensShapes for REST and Connect alike (same messages), after
 * the per-request total of numbers — so a zstd frame is inflated only within that total.
 */
function parseTensorDict(value: Record<string, unknown>): Tensor {
  const header = readDictHeader(value, true);
  if (strictBase64ByteLength(header.data) === null) {
    throw new TensorRefusal(
      "data is not strict base64 (only A–Z, a–z, 0–9, '+', '/', '=' padding at the end, length a multiple of 4)",
    );
  }
  return create(TensorSchema, {
    dtype: header.dtype,
    shape: header.shape,
    data: decodeBase64(header.data),
    compression: header.zstd ? Compression.ZSTD : Compression.UNSPECIFIED,
  });
}

/** A TensorRefusal of a request field → ApiError 400 `invalid_request`. */
function requestError(param: string, refusal: TensorRefusal): ApiError {
  const field = refusal.isTypeError ? refusal.field : undefined;
  // A key of the tensor object after a dot (`….dtype`), an element's index as it is (`…[0][1]`).
  const at = field === undefined ? param : field.startsWith("[") ? `${param}${field}` : `${param}.${field}`;
  const kind = refusal.isTypeError ? "Invalid type for" : "Invalid value for";
  const message = refusal.message.endsWith(".") ? refusal.message : `${refusal.message}.`;
  return invalidRequest(at, `${kind} '${at}': ${message}`);
}

/**
 * A REST tensor → acs.v1.Tensor (proto/API.md §6).
 *
 * Accepts nested number arrays, 2D or 3D, rectangular, every element a finite number within the
 * float32 range (plain JS numbers, as JSON.parse gives them) → FLOAT32 raw; or the vllm-lens
 * dict `{data: base64, dtype: "float32"|"float16"|"int16", original_dtype?, shape, compression?:
 * "zstd"|null}` (int16 = bfloat16 bits; original_dtype, when given, must match the dtype) → the
 * same dtype, its bytes as sent (zstd stays compressed: checkLensShapes checks shape, length and
 * values later, on both surfaces, inflating within the request's total of numbers). Nested arrays
 * hold at most 2^23 numbers ({@link MAX_REQUEST_TENSOR_ELEMENTS}), checked before any allocation.
 *
 * Throws ApiError 400 `invalid_request` with `param` = `param` for a bad value (unknown key, bad
 * dtype or compression, base64 that is not strict), or `param.data`/`.dtype`/`.shape`/
 * `.original_dtype`/`.compression` for a dict key of the wrong type.
 */
export function parseTensorJson(value: unknown, param: string): Tensor {
  try {
    if (Array.isArray(value)) return parseNestedArrays(value);
    if (isPlainObject(value)) return parseTensorDict(value);
    throw new TensorRefusal("expected an array of arrays of numbers or a tensor object", {
      isTypeError: true,
    });
  } catch (err) {
    if (err instanceof TensorRefusal) throw requestError(param, err);
    throw err;
  }
}

/**
 * acs.v1.Tensor → the vllm-lens dict of REST responses, which vllm-lens's own decoder reads: bf16
 * as dtype "int16" with original_dtype "torch.bfloat16", f16 as "float16"/"torch.float16", f32 as
 * "float32"/"torch.float32"; `compression` "zstd" when the tensor's bytes are a zstd frame, else
 * null. The bytes are base64-encoded as they are (no re-encoding).
 */
export function tensorToVllmLensJson(tensor: Tensor): VllmLensTensorJson {
  const dtype = tensor.dtype;
  if (dtype !== Dtype.BFLOAT16 && dtype !== Dtype.FLOAT16 && dtype !== Dtype.FLOAT32) {
    throw new Error(`tensorToVllmLensJson: tensor dtype ${dtype} is not BFLOAT16, FLOAT16 or FLOAT32`);
  }
  const names = JSON_DTYPE[dtype];
  return {
    data: encodeBase64(tensor.data),
    dtype: names.dtype,
    original_dtype: names.original,
    shape: [...tensor.shape],
    compression: tensor.compression === Compression.ZSTD ? "zstd" : null,
  };
}

/**
 * A vllm-lens tensor dict from Inference → acs.v1.Tensor, keeping its bytes as they are (a zstd
 * frame stays compressed). Checks the dict's types, dtype, strict base64, at most 2^25 numbers,
 * and the byte length against the shape (raw: the data length; zstd: the content size the frame
 * header declares). A frame that declares no size is inflated (bounded) to check it and
 * compressed again with its size, so that Python's `zstandard` can read what callers get.
 * Keys other than the five known ones are ignored.
 *
 * Throws ApiError 502 `upstream_error` when the dict is malformed.
 */
export function tensorFromVllmLensJson(value: unknown): Tensor {
  try {
    if (!isPlainObject(value))
      throw new TensorRefusal(`expected a tensor object, got ${jsonTypeName(value)}`);
    const header = readDictHeader(value, false);
    const elements = tensorElementCount(header.shape, MAX_TENSOR_ELEMENTS);
    const { bytes, expected } = dictBytes(header, elements);
    let data: Uint8Array = bytes;
    if (header.zstd) {
      const declared = zstdDeclaredSize(bytes);
      if (declared === null) {
        data = zstdCompress(zstdDecompressExact(bytes, expected));
      } else if (declared !== expected) {
        throw new TensorRefusal(
          `${describeExpectedBytes(header.shape, header.dtype, elements)} but the zstd frame declares ${declared} bytes`,
        );
      }
    }
    return create(TensorSchema, {
      dtype: header.dtype,
      shape: header.shape,
      data,
      compression: header.zstd ? Compression.ZSTD : Compression.UNSPECIFIED,
    });
  } catch (err) {
    if (err instanceof TensorRefusal) {
      const at = err.field === undefined ? "" : ` (${err.field})`;
      throw new ApiError(
        "upstream_error",
        `Inference sent a malformed activations tensor${at}: ${err.message}.`,
        {
          cause: err,
        },
      );
    }
    throw err;
  }
}
