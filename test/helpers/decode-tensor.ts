/**
 * Independent decoders of vllm-lens tensor dicts, for tests: they share no code with the gateway
 * (src/lens) or the reference engine (src/engine), so a test that compares their numbers with ours
 * catches a bug that an encoder and a decoder written together would agree on.
 *
 * - {@link jsDecoder}, always used: strict base64, the `fzstd` decompressor (pure JavaScript, not
 *   the zstd-napi binding the code uses), and bf16/f16/f32 read from their bit layout.
 * - {@link pythonDecoder}: `test/helpers/decode_tensor.py` on Debian's `/usr/bin/python3` with
 *   numpy and zstandard, as vllm-lens decodes. It needs system packages, so it runs only where
 *   `ACS_TEST_PYTHON_DECODER=1` says they are installed (`.ci/run` does so after installing
 *   python3-numpy and python3-zstandard); tests name the decoders they ran.
 */
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { decompress } from "fzstd";

/** A vllm-lens tensor dict as it travels in JSON (`data` standard base64). */
export interface TensorDict {
  data: string;
  dtype: string;
  original_dtype?: string;
  shape: number[];
  compression?: string | null;
}

/** A decoded tensor: its shape and its values widened to float32, C order. */
export interface DecodedTensor {
  shape: number[];
  values: Float32Array;
}

/** A decoder that shares no code with the code under test. */
export interface IndependentDecoder {
  /** What it is, for test names. */
  readonly name: string;
  /** Decodes each dict; throws on anything vllm-lens's own decoder would refuse. */
  decode(dicts: readonly TensorDict[]): DecodedTensor[];
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** Standard base64 only (as Python's `b64decode(validate=True)`); Buffer.from alone also takes base64url. */
function strictBase64(text: string): Uint8Array {
  if (!BASE64.test(text)) throw new Error("data is not standard base64");
  return new Uint8Array(Buffer.from(text, "base64"));
}

/**
 * The Frame_Content_Size a zstd frame header declares (RFC 8878 §3.1.1.1), null when it declares
 * none. Python's `zstandard` (what vllm-lens decodes with) refuses a frame without one.
 */
function declaredContentSize(frame: Uint8Array): number | null {
  const view = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  if (frame.length < 6 || view.getUint32(0, true) !== 0xfd2fb528) throw new Error("not a zstd frame");
  const descriptor = frame[4] as number;
  const fcsFlag = descriptor >> 6;
  const singleSegment = (descriptor >> 5) & 1;
  const dictIdBytes = [0, 1, 2, 4][descriptor & 3] as number;
  const fcsBytes = [singleSegment ? 1 : 0, 2, 4, 8][fcsFlag] as number;
  const at = 5 + (singleSegment ? 0 : 1) + dictIdBytes;
  if (frame.length < at + fcsBytes) throw new Error("truncated zstd frame header");
  switch (fcsBytes) {
    case 0:
      return null;
    case 1:
      return view.getUint8(at);
    case 2:
      return view.getUint16(at, true) + 256;
    case 4:
      return view.getUint32(at, true);
    default:
      return Number(view.getBigUint64(at, true));
  }
}

/** A float16 from its bits: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
function halfToNumber(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

function decodeOne(dict: TensorDict): DecodedTensor {
  let bytes = strictBase64(dict.data);
  if (dict.compression === "zstd") {
    const declared = declaredContentSize(bytes);
    if (declared === null) throw new Error("the zstd frame declares no content size");
    bytes = decompress(bytes);
    if (bytes.length !== declared)
      throw new Error(`zstd frame declares ${declared} bytes, inflates to ${bytes.length}`);
  } else if (dict.compression !== undefined && dict.compression !== null) {
    throw new Error(`unknown compression ${JSON.stringify(dict.compression)}`);
  }
  const count = dict.shape.reduce((a, b) => a * b, 1);
  const itemSize = { float32: 4, float16: 2, int16: 2 }[dict.dtype];
  if (itemSize === undefined) throw new Error(`unknown dtype ${JSON.stringify(dict.dtype)}`);
  if (bytes.length !== count * itemSize) {
    throw new Error(
      `shape ${JSON.stringify(dict.shape)} of ${dict.dtype} needs ${count * itemSize} bytes, got ${bytes.length}`,
    );
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const values = new Float32Array(count);
  if (dict.dtype === "float32") {
    // copied as bits, so NaN payloads and -0 stay as they are
    const bits = new Uint32Array(values.buffer);
    for (let i = 0; i < count; i++) bits[i] = view.getUint32(i * 4, true);
  } else if (dict.dtype === "float16") {
    for (let i = 0; i < count; i++) values[i] = halfToNumber(view.getUint16(i * 2, true));
  } else if (dict.original_dtype === "torch.bfloat16") {
    // bf16 is the upper half of a float32
    const bits = new Uint32Array(values.buffer);
    for (let i = 0; i < count; i++) bits[i] = view.getUint16(i * 2, true) << 16;
  } else {
    for (let i = 0; i < count; i++) values[i] = view.getInt16(i * 2, true);
  }
  return { shape: [...dict.shape], values };
}

/** Pure JavaScript: strict base64, fzstd, and the bit layouts of bf16, f16 and f32. */
export const jsDecoder: IndependentDecoder = {
  name: "fzstd + bit layouts (JS)",
  decode: (dicts) => dicts.map(decodeOne),
};

const script = fileURLToPath(new URL("./decode_tensor.py", import.meta.url));

/** numpy + zstandard on /usr/bin/python3 (test/helpers/decode_tensor.py). */
export const pythonDecoder: IndependentDecoder = {
  name: "numpy + zstandard (/usr/bin/python3)",
  decode(dicts) {
    const run = spawnSync("/usr/bin/python3", [script], {
      input: JSON.stringify(dicts),
      encoding: "utf8",
      maxBuffer: 1 << 28,
    });
    if (run.error) throw run.error;
    if (run.status !== 0) throw new Error(`decode_tensor.py exited ${run.status}: ${run.stderr}`);
    const out = JSON.parse(run.stdout) as Array<{ shape: number[]; float32: string }>;
    return out.map(({ shape, float32 }) => {
      const bytes = Buffer.from(float32, "base64");
      return { shape, values: new Float32Array(new Uint8Array(bytes).buffer) };
    });
  },
};

/**
 * The independent decoders this run uses: {@link jsDecoder}, and {@link pythonDecoder} too when
 * `ACS_TEST_PYTHON_DECODER=1` (then a missing numpy or zstandard fails the test, never skips it).
 */
export function independentDecoders(): IndependentDecoder[] {
  return process.env.ACS_TEST_PYTHON_DECODER === "1" ? [jsDecoder, pythonDecoder] : [jsDecoder];
}

/**
 * The index of the first value where two float32 arrays differ (-0 differs from 0; any NaN
 * equals any NaN), the shorter length when their lengths differ, or -1 when they are the same.
 */
export function firstDifference(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let i = 0; i < a.length; i++) {
    const x = a[i] as number;
    const y = b[i] as number;
    if (!(Object.is(x, y) || (Number.isNaN(x) && Number.isNaN(y)))) return i;
  }
  return -1;
}
