// The vllm_xargs entries of the lens fields, as JSON strings (src/upstream/vllm/VLLM.md: strings work on every vLLM).
import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import { Dtype, type Tensor } from "../../gen/acs/v1/lens_pb.js";
import { invalidRequest } from "../core/errors/index.js";
import { type Base64Source, type JsonText, type JsonTextPart, jsonText } from "../core/json-text/index.js";
import type { LensModelFacts } from "./check-lens-request.js";
import { dtypeWidth, isTensorDtype, rawBytesToFloat32, tensorRawBytes } from "./tensor-codec.js";
import { TensorRefusal } from "./tensor-refusal.js";

/** Elements widened to float32 per piece of a bf16/f16 tensor's base64 (48 KiB of float32). */
const WIDEN_ELEMENTS = 12 * 1024;

/**
 * Activations as vllm-lens's oldest decoder reads them: `{"data", "dtype": "float32", "shape"}`,
 * raw little-endian bytes, no `compression` and no `original_dtype` (the legacy form that newer
 * decoders still accept; a bf16 dict would be read as plain int16 by versions without
 * original_dtype, and zstd by versions without compression). bf16/f16 widen exactly to float32.
 * The JSON text holds the data as a {@link Base64Source} over the raw bytes: neither the float32
 * copy of a bf16/f16 tensor nor the base64 text is ever made whole (both are written in pieces
 * when the request body is sent).
 */
function steeringTensorWire(tensor: Tensor, param: string, decoded: Uint8Array | undefined): JsonTextPart[] {
  let raw: Uint8Array;
  try {
    raw = decoded ?? tensorRawBytes(tensor);
  } catch (err) {
    if (err instanceof TensorRefusal)
      throw invalidRequest(param, `Invalid value for '${param}': ${err.message}.`);
    throw err;
  }
  const dtype = tensor.dtype;
  if (!isTensorDtype(dtype)) throw invalidRequest(param, `Invalid value for '${param}': unknown dtype.`);
  return [
    '{"data":"',
    float32Source(raw, dtype),
    `","dtype":"float32","shape":${JSON.stringify([...tensor.shape])}}`,
  ];
}

/** The float32 bytes of raw element bytes of `dtype`, widened piece by piece when not float32. */
function float32Source(raw: Uint8Array, dtype: Dtype.BFLOAT16 | Dtype.FLOAT16 | Dtype.FLOAT32): Base64Source {
  if (dtype === Dtype.FLOAT32) return { byteLength: raw.byteLength, chunks: () => [raw] };
  const width = dtypeWidth(dtype);
  const elements = raw.byteLength / width;
  return {
    byteLength: elements * 4,
    *chunks() {
      for (let at = 0; at < elements; at += WIDEN_ELEMENTS) {
        const end = Math.min(at + WIDEN_ELEMENTS, elements);
        const values = rawBytesToFloat32(raw.subarray(at * width, end * width), dtype);
        yield new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
      }
    },
  };
}

/**
 * The vllm_xargs entries for the lens fields of `request` (run checkLensShapes first), each a
 * JSON text that is sent as a JSON string (vLLM parses it), or an empty object when the request
 * has none:
 *
 * - `output_residual_stream`: the sorted layer list, e.g. `"[0, 5]"`; all layers are sent as the
 *   explicit list 0 … numLayers − 1 (vllm-lens reads any non-list as "all layers", even `false`).
 * - `apply_steering_vectors`: `[{"activations": {"data", "dtype": "float32", "shape"},
 *   "layer_indices", "scale" (default 1), "norm_match" (default false), "position_indices"
 *   (null when absent)}, …]`, activations as raw float32 (see above).
 *
 * `output_residual_stream` is a plain string; `apply_steering_vectors` is a {@link JsonText}
 * whose tensor data stays raw bytes until the body is written (see steeringTensorWire), e.g.
 * `[{"activations":{"data":"<base64>","dtype":"float32","shape":[2,4]},"layer_indices":[4,1],…}]`.
 *
 * `decoded` are the vectors' raw bytes as {@link checkLensShapes} returned them (each tensor is
 * then not decoded again, and the JSON text keeps a reference to them); without them each tensor
 * is decoded here. Throws ApiError 400 `invalid_request` if a tensor's bytes do not match its
 * shape.
 */
export function lensVllmXargs(
  request: CreateCompletionRequest,
  model: Pick<LensModelFacts, "numLayers">,
  decoded: readonly Uint8Array[] = [],
): Record<string, string | JsonText> {
  const xargs: Record<string, string | JsonText> = {};
  const capture = request.outputResidualStream;
  if (capture !== undefined) {
    const layers = capture.allLayers
      ? Array.from({ length: model.numLayers }, (_, i) => i)
      : [...new Set(capture.layerIndices)].sort((a, b) => a - b);
    xargs.output_residual_stream = `[${layers.join(", ")}]`;
  }
  const vectors = request.applySteeringVectors;
  if (vectors.length > 0) {
    // One entry per vector, keys in this order, every default explicit:
    // {"activations", "layer_indices", "scale", "norm_match", "position_indices"}.
    const parts: JsonTextPart[] = ["["];
    vectors.forEach((vector, i) => {
      const param = `apply_steering_vectors[${i}].activations`;
      const tensor = vector.activations;
      if (tensor === undefined) throw invalidRequest(param, `Missing required parameter: '${param}'.`);
      const rest = {
        layer_indices: [...vector.layerIndices],
        scale: vector.scale ?? 1,
        norm_match: vector.normMatch ?? false,
        position_indices: vector.positionIndices.length > 0 ? [...vector.positionIndices] : null,
      };
      parts.push(
        i === 0 ? '{"activations":' : ',{"activations":',
        ...steeringTensorWire(tensor, param, decoded[i]),
        `,${JSON.stringify(rest).slice(1)}`,
      );
    });
    parts.push("]");
    xargs.apply_steering_vectors = jsonText(parts);
  }
  return xargs;
}
