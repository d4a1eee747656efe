// zstd for tensor bytes: level-1 compression (as vllm-lens does) and decompression of untrusted
// input into a buffer of exactly the expected size, stopping as soon as the stream would give more.
import binding from "zstd-napi/binding.js";
import { TensorRefusal } from "./tensor-refusal.js";

/** zstd level vllm-lens compresses with (and so does the gateway). */
export const ZSTD_LEVEL = 1;

const SCRATCH = Buffer.alloc(64);

/**
 * One zstd frame (level 1, content size in the header so that Python's `zstandard` can read it)
 * holding `bytes`.
 */
export function zstdCompress(bytes: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(binding.compressBound(bytes.byteLength));
  const length = binding.compress(out, bytes, ZSTD_LEVEL);
  return out.subarray(0, length);
}

/** The content size a zstd frame declares in its header, null when it declares none. */
export function zstdDeclaredSize(frame: Uint8Array): number | null {
  try {
    return binding.getFrameContentSize(frame);
  } catch (err) {
    throw new TensorRefusal(`data is not a zstd frame (${(err as Error).message})`);
  }
}

/** log2 of the largest zstd window accepted for an output of `expected` bytes. */
function windowLogMax(expected: number): number {
  const needed = Math.ceil(Math.log2(Math.max(expected, 1)));
  return Math.min(27, Math.max(20, needed));
}

/**
 * Inflates the single zstd frame `frame` into a new buffer of exactly `expected` bytes.
 *
 * Memory is bounded by `expected` (plus a zstd window of at most max(1 MiB, expected)), whatever
 * the frame says: a declared content size other than `expected` is refused from the header alone,
 * and inflating stops as soon as the stream yields one byte more than `expected` (a zstd bomb
 * costs at most `expected` bytes of work). Throws {@link TensorRefusal} (its message completes "… but") for a frame that is
 * malformed, truncated, followed by other bytes, or inflates to a different size.
 */
export function zstdDecompressExact(frame: Uint8Array, expected: number): Buffer {
  const declared = zstdDeclaredSize(frame);
  if (declared !== null && declared !== expected) {
    throw new TensorRefusal(`the zstd frame declares ${declared} bytes`);
  }
  const dctx = new binding.DCtx();
  dctx.setParameter(binding.DParameter.windowLogMax, windowLogMax(expected));
  const out = Buffer.allocUnsafe(expected);
  let inPos = 0;
  let outPos = 0;
  for (;;) {
    const full = outPos >= expected;
    const dst = full ? SCRATCH : out.subarray(outPos);
    let result: [number, number, number];
    try {
      result = dctx.decompressStream(dst, frame.subarray(inPos));
    } catch (err) {
      throw new TensorRefusal(`data is not a valid zstd frame (${(err as Error).message})`);
    }
    const [remaining, produced, consumed] = result;
    inPos += consumed;
    if (full && produced > 0) throw new TensorRefusal(`data inflates to more than ${expected} bytes`);
    outPos += produced;
    if (remaining === 0) break; // frame complete
    if (produced === 0 && consumed === 0) {
      // No progress: the input is used up (truncated frame), or the decoder is stuck.
      if (inPos >= frame.length) {
        throw new TensorRefusal(`the zstd frame is truncated after ${outPos} of ${expected} bytes`);
      }
      throw new TensorRefusal("data is not a valid zstd frame (the decoder made no progress)");
    }
  }
  if (outPos !== expected) throw new TensorRefusal(`data inflates to only ${outPos} bytes`);
  if (inPos !== frame.length) {
    throw new TensorRefusal(`${frame.length - inPos} bytes follow the zstd frame`);
  }
  return out;
}
