// The vllm_xargs entries of the lens fields, as JSON strings (VLLM.md: strings work on every vLLM).
import type { CreateCompletionRequest } from "../../gen/acs/v1/completions_pb.js";
import { Dtype, type Tensor } from "../../gen/acs/v1/lens_pb.js";
import { invalidRequest } from "../errors/index.js";
import type { LensModelFacts } from "./check-lens-request.js";
import { encodeBase64 } from "./strict-base64.js";
import { isTensorDtype, rawBytesToFloat32, tensorRawBytes } from "./tensor-codec.js";
import { TensorRefusal } from "./tensor-refusal.js";

/** The tensor dict sent to vllm-lens for steering: raw float32, the form every version decodes. */
interface SteeringTensorWire {
  data: string;
  dtype: "float32";
  shape: number[];
}

/** One entry of vllm-lens's `apply_steering_vectors` list, every default explicit. */
interface SteeringVectorWire {
  activations: SteeringTensorWire;
  layer_indices: number[];
  scale: number;
  norm_match: boolean;
  position_indices: number[] | null;
}

/**
 * Activations as vllm-lens's oldest decoder reads them: `{data, dtype: "float32", shape}`, raw
 * little-endian bytes, no `compression` and no `original_dtype` (the legacy form that newer
 * decoders still accept; a bf16 dict would be read as plain int16 by versions without
 * original_dtype, and zstd by versions without compression). bf16/f16 widen exactly to float32.
 */
function steeringTensorWire(
  tensor: Tensor,
  param: string,
  decoded: Uint8Array | undefined,
): SteeringTensorWire {
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
  let bytes = raw;
  if (dtype !== Dtype.FLOAT32) {
    const values = rawBytesToFloat32(raw, dtype);
    bytes = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  }
  return { data: encodeBase64(bytes), dtype: "float32", shape: [...tensor.shape] };
}

/**
 * The vllm_xargs entries for the lens fields of `request` (run checkLensShapes first),
 * each a JSON string, or an empty object when the request has none:
 *
 * - `output_residual_stream`: the sorted layer list, e.g. `"[0, 5]"`; all layers are sent as the
 *   explicit list 0 … numLayers − 1 (vllm-lens reads any non-list as "all layers", even `false`).
 * - `apply_steering_vectors`: `[{"activations": {"data", "dtype": "float32", "shape"},
 *   "layer_indices", "scale" (default 1), "norm_match" (default false), "position_indices"
 *   (null when absent)}, …]`, activations as raw float32 (see above).
 *
 * `decoded` are the vectors' raw bytes as {@link checkLensShapes} returned them (each tensor is
 * then not decoded again); without them each tensor is decoded here. Throws ApiError 400
 * `invalid_request` if a tensor's bytes do not match its shape.
 */
export function lensVllmXargs(
  request: CreateCompletionRequest,
  model: LensModelFacts,
  decoded: readonly Uint8Array[] = [],
): Record<string, string> {
  const xargs: Record<string, string> = {};
  const capture = request.outputResidualStream;
  if (capture !== undefined) {
    const layers = capture.allLayers
      ? Array.from({ length: model.numLayers }, (_, i) => i)
      : [...new Set(capture.layerIndices)].sort((a, b) => a - b);
    xargs.output_residual_stream = `[${layers.join(", ")}]`;
  }
  const vectors = request.applySteeringVectors;
  if (vectors.length > 0) {
    const wire: SteeringVectorWire[] = vectors.map((vector, i) => {
      const param = `apply_steering_vectors[${i}].activations`;
      const tensor = vector.activations;
      if (tensor === undefined) throw invalidRequest(param, `Missing required parameter: '${param}'.`);
      return {
        activations: steeringTensorWire(tensor, param, decoded[i]),
        layer_indices: [...vector.layerIndices],
        scale: vector.scale ?? 1,
        norm_match: vector.normMatch ?? false,
        position_indices: vector.positionIndices.length > 0 ? [...vector.positionIndices] : null,
      };
    });
    xargs.apply_steering_vectors = JSON.stringify(wire);
  }
  return xargs;
}
